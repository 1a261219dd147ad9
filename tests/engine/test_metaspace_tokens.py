"""Grammars over a tokenizer with SentencePiece's ``Metaspace`` decoder,
which llguidance does not read itself (``metaspace_tokens`` gives it the
token bytes): each token's bytes are what the tokenizer's own decoder
appends for it in the middle of a text (tokenizers' ``decode`` is the
reference), the masks of the tests' SentencePiece-style vocabulary are
worked out by hand, and constrained requests on a model with that tokenizer
give outputs that validate (``jsonschema``, ``re``)."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from engine import LLM, SamplingParams, StructuredOutputsParams
from engine.structured_outputs import StructuredOutputManager
from engine.structured_outputs.metaspace_tokens import (
    decodes_metaspace,
    mid_text_encoder,
    token_bytes,
)
from ipc.messages import SchedulerOutput
from tests.helpers.hf_models import (
    SPM_PIECES,
    save_sentencepiece_style,
    sentencepiece_style_tokenizer,
)

EOS = 2
BYTE_PIECES = [f"<0x{b:02X}>" for b in (0x0A, 0xE2, 0x82, 0xAC)]


def _spec(tokenizer: Tokenizer) -> dict:
    return json.loads(tokenizer.to_str())


def byte_fallback_tokenizer() -> Tokenizer:
    """The SentencePiece-style vocabulary plus byte pieces, its decoder a
    Sequence of Metaspace, ByteFallback and Fuse (a newline and "€" are
    written by bytes)."""
    pieces = [*SPM_PIECES, *BYTE_PIECES]
    tok = Tokenizer(models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=[],
                               unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Sequence([
        decoders.Metaspace(replacement="\u2581", prepend_scheme="always"),
        decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(p, special=True) for p in pieces[:3]])
    return tok


@pytest.mark.parametrize("make", [sentencepiece_style_tokenizer, byte_fallback_tokenizer])
def test_token_bytes_are_what_the_decoder_appends_mid_text(make):
    tok = make()
    vocab = tok.get_vocab_size() + 5  # a model's vocabulary may be wider
    tokens = token_bytes(_spec(tok), vocab)
    assert tokens[vocab - 5:] == [b""] * 5
    word = SPM_PIECES.index("\u2581t")
    head = tok.decode([word])
    for token_id in range(3, tok.get_vocab_size()):
        text = tok.decode([word, token_id])
        if "\ufffd" not in text:  # a byte piece alone is no whole character
            assert head + tokens[token_id].decode() == text, tok.id_to_token(token_id)
    assert tokens[:3] == [b"<unk>", b"<s>", b"</s>"]  # special: their text (llguidance marks them)
    assert tokens[SPM_PIECES.index("\u2581a")] == b" a"


def test_byte_pieces_are_bytes_only_beside_a_byte_fallback_decoder():
    with_bytes = byte_fallback_tokenizer()
    tokens = token_bytes(_spec(with_bytes), with_bytes.get_vocab_size())
    ids = [with_bytes.token_to_id(p) for p in BYTE_PIECES]
    assert [tokens[i] for i in ids] == [b"\n", b"\xe2", b"\x82", b"\xac"]
    word = SPM_PIECES.index("\u2581t")
    assert with_bytes.decode([word, *ids]) == "t\n€" == b"".join(
        tokens[i] for i in [word, *ids]).decode()[1:]
    # A plain Metaspace decoder writes a byte piece as its text.
    spec = _spec(with_bytes)
    spec["decoder"] = spec["decoder"]["decoders"][0]
    plain = Tokenizer.from_str(json.dumps(spec))
    assert plain.decode([word, ids[0]]) == "t<0x0A>"
    assert token_bytes(spec, plain.get_vocab_size())[ids[0]] == b"<0x0A>"


def test_which_decoders_are_metaspace(tiny_dir):
    with open(f"{tiny_dir}/tokenizer.json", encoding="utf-8") as f:
        assert not decodes_metaspace(json.load(f))  # byte-level: llguidance reads it
    assert decodes_metaspace(_spec(sentencepiece_style_tokenizer()))
    assert decodes_metaspace(_spec(byte_fallback_tokenizer()))
    legacy = sentencepiece_style_tokenizer()
    legacy.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                        decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    assert not decodes_metaspace(_spec(legacy))  # Llama 2's chain: llguidance reads it


def test_forced_text_is_tokenized_without_a_prepended_space():
    spec = _spec(sentencepiece_style_tokenizer())
    tokens = token_bytes(spec, len(SPM_PIECES))
    encode = mid_text_encoder(spec)
    for text in ("a cat", "dog.", " x y"):
        assert b"".join(tokens[i] for i in encode(text)) == text.encode()
    # The tokenizer itself prepends one at the start of a text.
    assert "".join(sentencepiece_style_tokenizer().encode("a cat").tokens) == "\u2581a\u2581cat"


@pytest.fixture(scope="module")
def manager(tmp_path_factory):
    path = tmp_path_factory.mktemp("spm") / "tokenizer.json"
    sentencepiece_style_tokenizer().save(str(path))
    m = StructuredOutputManager(str(path), len(SPM_PIECES), [EOS], timeout_s=30)
    yield m
    m.shutdown()


class _Request:
    def __init__(self, grammar):
        self.grammar = grammar


def _allowed(manager, grammar) -> list[str]:
    """The pieces the grammar's mask allows next."""
    plan = SchedulerOutput(step_id=1, structured_output_req_ids=["r"])
    bitmask = manager.bitmask(plan, {"r": _Request(grammar)})
    words = np.frombuffer(bitmask.bitmask, dtype="<i4")
    bits = (words[:, None].astype(np.int64) >> np.arange(32)) & 1
    return sorted(SPM_PIECES[i] for i in np.flatnonzero(bits.reshape(-1)[:len(SPM_PIECES)]))


def _grammar(manager, **constraint):
    params = SamplingParams(structured_outputs=StructuredOutputsParams(**constraint))
    manager.check(params)
    return manager.new_grammar(params)


def test_masks_of_regexes_with_spaces_worked_by_hand(manager):
    """"a( b|c)d": "a" (not "▁a", which writes " a"); then "c", " b" ("▁b")
    or the space alone ("▁"); then "d", which ends it. Text the
    grammar forces is written as the tokenizer writes it mid-text (llguidance
    asks it back): " bc" after "a" in "a bc" is "▁", "b", "c" (no merges)."""
    piece = SPM_PIECES.index
    grammar = _grammar(manager, regex="a( b|c)d")
    assert _allowed(manager, grammar) == ["a"]
    assert grammar.accept(piece("a"))
    assert _allowed(manager, grammar) == ["c", "\u2581", "\u2581b"]
    assert grammar.accept(piece("\u2581b"))
    assert _allowed(manager, grammar) == ["d"]
    assert grammar.accept(piece("d")) and grammar.is_terminated()
    forced = _grammar(manager, regex="a bc")
    assert forced.accept(piece("a"))
    assert _allowed(manager, forced) == ["\u2581"]
    assert forced.accept(piece("\u2581"))
    assert _allowed(manager, forced) == ["b"]


SCHEMA = {
    "type": "object",
    "properties": {"name": {"enum": ["a cat", "the dog"]},
                   "n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["name", "n"],
    "additionalProperties": False,
}
REGEX = r"[a-z]{1,4}( [a-z]{1,4}){2,3}\."
CHOICES = ["a cat", "the dog", "big red fox"]


@pytest.mark.timeout(300)
def test_constrained_requests_on_a_sentencepiece_model_validate(tmp_path):
    """JSON schema (whitespace allowed: written by "▁" tokens), regex and
    choice requests, sampled at temperature 1, each finish within their
    tokens with text that validates."""
    path = save_sentencepiece_style(tmp_path)
    constraints = [StructuredOutputsParams(json=SCHEMA), StructuredOutputsParams(regex=REGEX),
                   StructuredOutputsParams(choice=CHOICES)]
    params = [SamplingParams(temperature=1.0, seed=seed, max_tokens=80, structured_outputs=c)
              for seed in range(6) for c in constraints]
    with LLM(model=path, device="cpu", max_model_len=128) as llm:
        outs = llm.generate(["the cat"] * len(params), params)
    texts = {0: [], 1: [], 2: []}
    for i, out in enumerate(outs):
        completion = out.outputs[0]
        assert completion.finish_reason == "stop", completion
        texts[i % 3].append(completion.text)
    for text in texts[0]:
        jsonschema.validate(json.loads(text), SCHEMA)
    assert all(re.fullmatch(REGEX, text) for text in texts[1]), texts[1]
    assert all(text in CHOICES for text in texts[2]), texts[2]
