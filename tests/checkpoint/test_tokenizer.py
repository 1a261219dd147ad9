"""Tokenizer, IncrementalDetokenizer and the model description on tiny model dirs built
here with the `tokenizers` library (byte-level BPE, no network)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from checkpoint.description import describe
from checkpoint.tokenizer import IncrementalDetokenizer, Tokenizer
from tests.helpers.allocations import Allocations, held_by

CORPUS = ["hello world", "the quick brown fox", "hello there world"] * 20
MULTIBYTE = "héllo wörld 你好 🎉 ok"


def build_hf(post_bos: bool = False) -> HFTokenizer:
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    if post_bos:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
        )
    return tok


def write_dir(tmp_path, config: dict | None, post_bos: bool = False):
    build_hf(post_bos).save(str(tmp_path / "tokenizer.json"))
    if config is not None:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return str(tmp_path)


@pytest.fixture
def tok(tmp_path) -> Tokenizer:
    config = {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "add_bos_token": False}
    return Tokenizer.from_dir(write_dir(tmp_path, config))


@pytest.mark.parametrize("text", ["hello world", MULTIBYTE, "", "  spaces\n\ttabs "])
def test_round_trip(tok, text):
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


@pytest.mark.parametrize("text, at", [("a\ud800b", 1), ("h\u00e9\udfff", 2)])
def test_a_lone_surrogate_is_a_value_error_naming_where(tok, text, at):
    """The tokenizers library refuses such a str with a TypeError; the
    caller gave a bad value, so it is a ValueError that says where."""
    with pytest.raises(ValueError, match=f"not valid Unicode: surrogates not allowed at "
                                         f"character {at}"):
        tok.encode(text)
    assert tok.encode("h\u00e9") == tok.hf.encode("h\u00e9").ids


def test_special_ids_and_decode_skips_specials(tok):
    assert tok.bos_token_id == tok.hf.token_to_id("<s>")
    assert tok.eos_token_id == tok.hf.token_to_id("</s>")
    assert tok.vocab_size == tok.hf.get_vocab_size(with_added_tokens=True)
    ids = tok.encode("hello")
    assert tok.decode([tok.bos_token_id, *ids, tok.eos_token_id]) == "hello"


@pytest.mark.parametrize(
    "config, post_bos, want_bos",
    [
        ({"bos_token": "<s>", "add_bos_token": True}, False, 1),
        ({"bos_token": "<s>", "add_bos_token": True}, True, 1),
        ({"bos_token": "<s>", "add_bos_token": False}, True, 0),
        ({"bos_token": "<s>"}, False, 0),
        ({"bos_token": "<s>"}, True, 1),
        (None, False, 0),
    ],
)
def test_bos(tmp_path, config, post_bos, want_bos):
    tok = Tokenizer.from_dir(write_dir(tmp_path, config, post_bos))
    ids = tok.encode("hello world")
    bos = tok.hf.token_to_id("<s>")
    assert ids.count(bos) == want_bos
    assert ids[:want_bos] == [bos] * want_bos
    assert tok.decode(ids) == "hello world"


@pytest.fixture(scope="module")
def post_bos_tok(tmp_path_factory) -> Tokenizer:
    """BOS from the tokenizer's post-processor (no add_bos_token)."""
    return Tokenizer.from_dir(write_dir(tmp_path_factory.mktemp("tok"), {"bos_token": "<s>"},
                                        post_bos=True))


@settings(max_examples=200, deadline=None)
@given(text=st.lists(st.one_of(st.text(), st.sampled_from(["<s>", "</s>", " ", "\n", "🎉"])),
                     max_size=10).map("".join))
def test_encode_gives_the_ids_of_plain_encode(post_bos_tok, text):
    """``encode`` (through ``encode_batch``, which lets other threads run)
    gives the library's ``encode`` ids, with and without special tokens."""
    tok = post_bos_tok
    assert tok.encode(text) == tok.hf.encode(text).ids
    assert tok.encode(text, add_special_tokens=False) == \
        tok.hf.encode(text, add_special_tokens=False).ids


def test_missing_or_unreadable_tokenizer_files_are_value_errors_naming_the_file(tmp_path):
    """The model's fault, so the engine's one-line ConfigError, not a traceback."""
    with pytest.raises(ValueError, match="no tokenizer.json"):
        Tokenizer.from_dir(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match=f"cannot read {tmp_path}/tokenizer.json: "):
        Tokenizer.from_dir(str(tmp_path))
    (tmp_path / "good").mkdir()
    good = write_dir(tmp_path / "good", {})
    (tmp_path / "good" / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="tokenizer_config.json does not hold a JSON object"):
        Tokenizer.from_dir(good)


def test_add_bos_without_bos_token(tmp_path):
    with pytest.raises(ValueError, match="no bos_token"):
        Tokenizer.from_dir(write_dir(tmp_path, {"add_bos_token": True}))


@pytest.mark.parametrize("prompt", ["", "hello", "你"])
def test_incremental_detokenizer_is_utf8_safe(tok, prompt):
    ids = tok.encode(MULTIBYTE)
    assert len(ids) > len(MULTIBYTE.encode()) // 2  # multi-byte chars span tokens
    detok = IncrementalDetokenizer(tok, tok.encode(prompt))
    pieces = [detok.feed([i]) for i in ids]
    assert "".join(pieces) == MULTIBYTE == detok.output_text
    assert all("\ufffd" not in p for p in pieces)
    assert pieces.count("") >= 3  # the emoji's first bytes were held back
    assert "🎉" in pieces


def test_incremental_detokenizer_copies_no_text_per_token(tok):
    """The text released is not copied whole for each token: fed a long
    output one token at a time, the memory each token allocates at its
    peak (``tracemalloc``, no clock), summed, about doubles when the output
    does, where copying the text so far at each token would quadruple it;
    the pieces and ``output_text`` are the output's text."""
    allocated = []
    for n in (400, 800):
        text = "the quick brown fox " * n
        detok, count, pieces = IncrementalDetokenizer(tok), Allocations(), []
        with count.tracing():
            for token in tok.encode(text):
                with count.piece():
                    pieces.append(detok.feed([token]))
        assert "".join(pieces) == text == detok.output_text
        allocated.append(count.total)
    assert allocated[1] <= 2.5 * allocated[0], allocated


def test_incremental_detokenizer_keeps_its_text_at_about_its_size(tok):
    """The text released is kept at about its own size, not as one string
    object per piece: fed 20,000 characters that each come out as a piece
    of their own (three byte tokens a character), the memory the
    detokenizer holds beyond a list of the same token ids is a few times
    the text's, where a string per piece would hold some eighty bytes a
    character (about forty times the text's two)."""
    text = "你好世界" * 5000
    ids = tok.encode(text)
    assert len(ids) == 3 * len(text)

    def fed() -> IncrementalDetokenizer:
        detok = IncrementalDetokenizer(tok)
        for token in ids:
            detok.feed([token])
        return detok

    def listed() -> list[int]:
        kept: list[int] = []
        for token in ids:
            kept.extend([token])
        return kept

    detok, held = held_by(fed)
    _, held_by_ids = held_by(listed)
    assert detok.output_text == text
    text_size = 2 * len(text)  # its characters' bytes in a str (two each here)
    assert held - held_by_ids <= 4 * text_size, (held, held_by_ids, text_size)


def test_incremental_detokenizer_many_at_once_and_specials(tok):
    ids = tok.encode(MULTIBYTE)
    detok = IncrementalDetokenizer(tok)
    text = detok.feed(ids[:7]) + detok.feed([tok.eos_token_id]) + detok.feed(ids[7:])
    assert text == MULTIBYTE


def test_description_reads_both_config_files(tmp_path):
    config = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2,
        "eos_token_id": 2,
        "bos_token_id": 1,
        "max_position_embeddings": 512,
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 2, 7]}))
    info = describe(str(tmp_path))
    assert (info.vocab_size, info.eos_token_ids, info.max_position_embeddings, info.architecture,
            info.dtype, info.bos_token_id, info.head_dim) == (
        300, (2, 5, 7), 512, "LlamaForCausalLM", "bfloat16", 1, 16)
    del config["torch_dtype"], config["eos_token_id"], config["max_position_embeddings"]
    config["dtype"] = "float16"
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").unlink()
    info = describe(str(tmp_path))
    assert info.dtype == "float16" and info.eos_token_ids == ()
    assert info.max_position_embeddings is None


def test_description_errors_name_the_file(tmp_path):
    with pytest.raises(ValueError, match="missing .*config.json"):
        describe(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="config.json: no 'num_attention_heads'"):
        describe(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["GPT2LMHeadModel"], "vocab_size": 3, "hidden_size": 8,
        "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2}))
    with pytest.raises(ValueError, match="config.json: unsupported architecture 'GPT2LMHeadModel'"):
        describe(str(tmp_path))


def test_transformers_names_give_transformers_results(tiny_dir):
    """What scripts written against vLLM's ``get_tokenizer()`` (a
    transformers tokenizer) call, against transformers' own tokenizer of
    the same directory: the chat template rendered and tokenized, alone and
    batched, with a template variable and a continued final message; the
    vocabulary, ids <-> tokens, special tokens, batch decoding."""
    from transformers import AutoTokenizer

    ours, hf = Tokenizer.from_dir(tiny_dir), AutoTokenizer.from_pretrained(tiny_dir)

    def hf_chat(conversation, **kwargs):  # ids as a list (newer transformers wrap them)
        out = hf.apply_chat_template(conversation, **kwargs)
        return out["input_ids"] if hasattr(out, "keys") else out

    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}]
    begun = [*chat, {"role": "assistant", "content": "It is"}]
    for kwargs in ({}, {"add_generation_prompt": True}, {"tokenize": False},
                   {"tokenize": False, "add_generation_prompt": True, "day": "Monday"}):
        assert ours.apply_chat_template(chat, **kwargs) == hf_chat(chat, **kwargs)
    for tokenize in (False, True):
        assert ours.apply_chat_template([chat, begun[1:]], tokenize=tokenize) == \
            hf_chat([chat, begun[1:]], tokenize=tokenize)
        assert ours.apply_chat_template(begun, continue_final_message=True,
                                        tokenize=tokenize) == \
            hf_chat(begun, continue_final_message=True, tokenize=tokenize)
    with pytest.raises(TypeError, match="return_tensors"):
        ours.apply_chat_template(chat, return_tensors="pt")
    assert ours.get_vocab() == hf.get_vocab() and len(ours) == len(hf)
    ids = ours.encode("héllo wörld")
    assert ours.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)
    assert ours.convert_ids_to_tokens(ids[1]) == hf.convert_ids_to_tokens(ids[1])
    tokens = hf.convert_ids_to_tokens(ids)
    assert ours.convert_tokens_to_ids(tokens) == hf.convert_tokens_to_ids(tokens) == ids
    assert (ours.bos_token, ours.eos_token) == (hf.bos_token, hf.eos_token)
    assert ours.batch_decode([ids, ids[2:]]) == hf.batch_decode([ids, ids[2:]])


@pytest.mark.parametrize("skip", [True, False])
def test_incremental_detokenizer_decodes_a_bounded_window_per_token(tok, skip):
    """Each token costs a decode of a few tokens, however many came before:
    fed a long run of special tokens (EOS written again and again, as
    under ``ignore_eos``) between two words, one token at a time, no decode
    reads more than a dozen ids (counted, no clock); skipped, the special
    tokens add nothing and a window that kept them would grow by each
    one. The pieces are vLLM's (``DecodeStream``)."""
    from tests.helpers.vllm_detokenizer import vllm_fast_pieces

    prompt = tok.encode("hello there")
    output = [*tok.encode(" the quick"), *[tok.eos_token_id] * 300, *tok.encode(" brown fox")]
    decoded: list[int] = []
    raw_decode = tok.raw_decode

    def counted(ids, skip_special_tokens=True):
        decoded.append(len(ids))
        return raw_decode(ids, skip_special_tokens)

    tok.raw_decode = counted
    detok = IncrementalDetokenizer(tok, prompt, skip)
    pieces = [detok.feed([t]) for t in output]
    assert pieces == vllm_fast_pieces(tok.hf, prompt, output, skip)
    assert detok.output_text == (" the quick brown fox" if skip else
                                 " the quick" + "</s>" * 300 + " brown fox")
    assert decoded and max(decoded) <= 12, max(decoded)
