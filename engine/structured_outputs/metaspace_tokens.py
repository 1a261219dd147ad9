"""The llguidance vocabulary of a tokenizer with a ``Metaspace`` decoder.

llguidance reads a tokenizer.json itself when its decoder is byte-level
(GPT-2's characters for bytes) or SentencePiece's legacy chain (``Replace``
"▁" by " ", ``ByteFallback``, ``Fuse``, ``Strip``). A ``Metaspace`` decoder,
which tokenizers gives other SentencePiece models, it refuses ("can't
determine decoder type"), or, inside a ``Sequence`` beside ``ByteFallback``,
reads with the "▁" left in the bytes. For such a tokenizer
(``decodes_metaspace``) the backend gives llguidance the bytes of every
token itself (``lltokenizer``).

A token's bytes (``token_bytes``) are what the decoder makes of it in the
middle of a text, which is what the engine's detokenizer appends for it (it
decodes an output after its prompt's tokens): the replacement character
(``▁``) is a space, a piece ``<0xNN>`` is that byte when the chain has
``ByteFallback`` (without it the decoder keeps the piece's text), a
``Replace`` step's string is replaced; ``Fuse`` and ``Strip`` change only
the start of a text. Special tokens keep their text (llguidance marks them,
so no grammar matches them as text); an id with no token has no bytes,
which llguidance never allows.

llguidance calls back into a tokenizer only to tokenize text it forces
(``mid_text_encoder``): the same tokenizer, without the space a ``Metaspace``
pre-tokenizer prepends to a text and without special tokens, so the tokens
spell exactly the text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import tokenizers

# Decoder steps whose effect on one token in the middle of a text is known.
_STEPS = ("Metaspace", "Replace", "ByteFallback", "Fuse", "Strip")
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _steps(decoder: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A decoder as its chain of steps (``Sequence``s flattened)."""
    if decoder is None:
        return []
    if decoder.get("type") == "Sequence":
        return [step for inner in decoder.get("decoders", []) for step in _steps(inner)]
    return [decoder]


def decodes_metaspace(spec: dict[str, Any]) -> bool:
    """Whether the tokenizer.json ``spec`` has a ``Metaspace`` decoder, alone
    or in a ``Sequence``."""
    return any(step.get("type") == "Metaspace" for step in _steps(spec.get("decoder")))


def _piece_rule(spec: dict[str, Any]) -> Callable[[str], bytes]:
    """Piece -> bytes, as the decoder renders a token in the middle of a
    text; ValueError for a step whose effect on one token is not known."""
    steps = _steps(spec.get("decoder"))
    unknown = sorted({str(step.get("type")) for step in steps} - set(_STEPS))
    replaced = [step for step in steps if step.get("type") == "Replace"]
    if unknown or any("String" not in step.get("pattern", {}) for step in replaced):
        raise ValueError(f"tokenizer.json: decoder steps {unknown or ['Replace by regex']} "
                         "beside Metaspace: no token bytes for structured outputs")
    byte_fallback = any(step.get("type") == "ByteFallback" for step in steps)
    swaps = []
    for step in steps:
        if step.get("type") == "Metaspace":
            swaps.append((step.get("replacement", "\u2581"), " "))
        elif step.get("type") == "Replace":
            swaps.append((step["pattern"]["String"], step.get("content", "")))

    def piece_bytes(piece: str) -> bytes:
        if byte_fallback and (match := _BYTE_PIECE.fullmatch(piece)):
            return bytes([int(match.group(1), 16)])
        for old, new in swaps:
            piece = piece.replace(old, new)
        return piece.encode("utf-8")

    return piece_bytes


def token_bytes(spec: dict[str, Any], vocab_size: int) -> list[bytes]:
    """The bytes of ids ``0 .. vocab_size - 1`` (special tokens: their text)."""
    hf = tokenizers.Tokenizer.from_str(json.dumps(spec))
    piece_bytes = _piece_rule(spec)
    special = set(special_ids(hf))
    tokens = []
    for token_id in range(vocab_size):
        piece = hf.id_to_token(token_id)
        if piece is None:
            tokens.append(b"")
        else:
            tokens.append(piece.encode("utf-8") if token_id in special else piece_bytes(piece))
    return tokens


def special_ids(hf: tokenizers.Tokenizer) -> list[int]:
    """The ids of the tokenizer's special added tokens."""
    return sorted(i for i, token in hf.get_added_tokens_decoder().items() if token.special)


def _no_prepended_space(pre_tokenizer: dict[str, Any] | None) -> dict[str, Any] | None:
    if pre_tokenizer is None:
        return None
    if pre_tokenizer.get("type") == "Sequence":
        return {**pre_tokenizer, "pretokenizers": [
            _no_prepended_space(p) for p in pre_tokenizer.get("pretokenizers", [])]}
    if pre_tokenizer.get("type") == "Metaspace":
        fixed = {**pre_tokenizer, "prepend_scheme": "never"}
        if "add_prefix_space" in fixed:
            fixed["add_prefix_space"] = False
        return fixed
    return pre_tokenizer


def _no_prepend(normalizer: dict[str, Any] | None) -> dict[str, Any] | None:
    if normalizer is None or normalizer.get("type") == "Prepend":
        return None
    if normalizer.get("type") == "Sequence":
        kept = [n for n in map(_no_prepend, normalizer.get("normalizers", [])) if n is not None]
        return {**normalizer, "normalizers": kept} if kept else None
    return normalizer


def mid_text_encoder(spec: dict[str, Any]) -> Callable[[str], list[int]]:
    """Text -> the ids that spell exactly it in the middle of a text."""
    fixed = {**spec, "pre_tokenizer": _no_prepended_space(spec.get("pre_tokenizer")),
             "normalizer": _no_prepend(spec.get("normalizer"))}
    hf = tokenizers.Tokenizer.from_str(json.dumps(fixed))
    return lambda text: hf.encode(text, add_special_tokens=False).ids


class _Vocabulary:
    """What ``llguidance.TokenizerWrapper`` reads: the tokens' bytes, the
    main EOS id, the special ids, and a call that tokenizes text."""

    def __init__(self, spec: dict[str, Any], vocab_size: int, eos_token_id: int) -> None:
        self.tokens = token_bytes(spec, vocab_size)
        self.eos_token_id = eos_token_id
        self.bos_token_id = None
        hf = tokenizers.Tokenizer.from_str(json.dumps(spec))
        self.special_token_ids = [i for i in special_ids(hf) if i < vocab_size]
        self._encode = mid_text_encoder(spec)

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return self._encode(text)


def lltokenizer(spec: dict[str, Any], vocab_size: int, eos_token_ids: list[int]) -> Any:
    """The ``llguidance.LLTokenizer`` of the tokenizer.json ``spec`` over
    the model's ``vocab_size`` ids, ``eos_token_ids`` ending a grammar
    (ValueError without one: llguidance would add an id of its own)."""
    from llguidance import LLTokenizer, TokenizerWrapper

    if not eos_token_ids:
        raise ValueError("structured outputs need the model's eos_token_id (config.json or "
                         "generation_config.json)")
    vocabulary = _Vocabulary(spec, vocab_size, eos_token_ids[0])
    return LLTokenizer(TokenizerWrapper(vocabulary), eos_token=eos_token_ids)
