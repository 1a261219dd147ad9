"""The embedded ``tiny`` model: written once, a valid HF directory, our logits match HF's."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from checkpoint.tiny_model import BOS, EOS, PAD, SPECIAL_TOKENS, TINY_NAME, ensure_tiny_model
from runner.attention.metadata import AttentionMetadata
from runner.distributed import TensorParallelGroup
from tests.helpers.checkpoints import build_model_from_dir


def digest(model_dir: str) -> dict[str, str]:
    return {name: hashlib.sha256(open(os.path.join(model_dir, name), "rb").read()).hexdigest()
            for name in sorted(os.listdir(model_dir))}


def test_idempotent_and_deterministic(tiny_dir, tmp_path):
    before = digest(tiny_dir)
    assert set(before) >= {"config.json", "model.safetensors", "tokenizer.json",
                           "tokenizer_config.json", "special_tokens_map.json"}
    assert ensure_tiny_model(os.path.dirname(tiny_dir)) == tiny_dir
    assert digest(tiny_dir) == before
    other = ensure_tiny_model(str(tmp_path))
    assert os.path.basename(other) == TINY_NAME and digest(other) == before


def test_concurrent_writers_leave_one_complete_copy(tmp_path):
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: ensure_tiny_model(str(tmp_path)), range(4)))
    assert len(set(paths)) == 1
    assert os.listdir(tmp_path) == [TINY_NAME]
    assert "model.safetensors" in os.listdir(paths[0])


def test_default_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TPRUN_CACHE", str(tmp_path))
    assert ensure_tiny_model() == os.path.join(str(tmp_path), TINY_NAME)


def test_an_unwritable_cache_is_named_with_the_way_out(tmp_path, monkeypatch):
    """A cache directory that cannot be made (here under a plain file) gives
    an error naming it and TPRUN_CACHE, not a bare errno."""
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("TPRUN_CACHE", str(tmp_path / "file" / "cache"))
    with pytest.raises(OSError, match=rf"^cannot write the model cache {tmp_path}/file/cache "
                                      r"\(Not a directory\): set TPRUN_CACHE"):
        ensure_tiny_model()


@settings(max_examples=50, deadline=None)
@given(text=st.text())
def test_tokenizer_round_trips_utf8(tiny_dir, text):
    """Text without a special token's string: <s>, then one id a UTF-8 byte."""
    assume(not any(name in text for name in SPECIAL_TOKENS))
    tok = Tokenizer.from_file(os.path.join(tiny_dir, "tokenizer.json"))
    ids = tok.encode(text).ids
    assert ids == [BOS] + list(text.encode("utf-8"))
    assert tok.decode(ids) == text


def test_special_token_strings_encode_as_the_special_tokens(tiny_dir):
    """As in Llama tokenizers, "<s>", "</s>" and "<pad>" in a text are the
    special tokens, which decoding skips."""
    tok = Tokenizer.from_file(os.path.join(tiny_dir, "tokenizer.json"))
    ids = tok.encode("a<s>b</s><pad>").ids
    assert ids == [BOS, ord("a"), BOS, ord("b"), EOS, PAD]
    assert tok.decode(ids) == "ab"


def test_loads_in_transformers(tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (BOS, EOS, PAD)
    text = "Grüße, 世界! 🙂"
    ids = tok(text).input_ids
    assert ids == [BOS] + list(text.encode()) and tok.decode(ids, skip_special_tokens=True) == text
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert model.config.architectures == ["LlamaForCausalLM"]
    assert model.config.vocab_size == 320 and model.dtype == torch.float32


def prefill_metadata(n: int, block_size: int) -> AttentionMetadata:
    """One request of n tokens in one step, blocks in reverse order."""
    num_blocks = -(-n // block_size)
    table = torch.arange(num_blocks - 1, -1, -1, dtype=torch.int32).view(1, -1)
    pos = torch.arange(n)
    slots = table[0, pos // block_size].long() * block_size + pos % block_size
    qsl = torch.tensor([0, n], dtype=torch.int32)
    seq_lens = torch.tensor([n], dtype=torch.int32)
    return AttentionMetadata(
        num_reqs=1, num_tokens=n, num_decodes=0, max_query_len=n, max_seq_len=n,
        query_start_loc=qsl, seq_lens=seq_lens, block_tables=table, slot_mapping=slots,
        query_start_loc_cpu=qsl.clone(), seq_lens_cpu=seq_lens.clone())


@torch.inference_mode()
def test_our_logits_match_transformers(tiny_dir):
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([BOS] + list(b"The quick brown fox jumps over the lazy dog"))
    reference = AutoModelForCausalLM.from_pretrained(tiny_dir).eval()(ids[None]).logits[0]
    model = build_model_from_dir(tiny_dir, torch.float32, torch.device("cpu"), TensorParallelGroup())
    n, block_size = len(ids), 16
    caches = [torch.zeros(model.kv_cache_shape(-(-n // block_size), block_size))
              for _ in model.layers]
    logits = model.compute_logits(model(ids, torch.arange(n), caches,
                                        prefill_metadata(n, block_size)))
    torch.testing.assert_close(logits, reference.float(), rtol=1e-4, atol=1e-4)
    assert torch.equal(logits.argmax(-1), reference.argmax(-1))
    real = logits[:, :259]
    assert 1.0 < float(real.std()) < 3.0, "logits should spread (std about 2)"
