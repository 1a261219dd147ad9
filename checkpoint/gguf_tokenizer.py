"""A GGUF file's tokenizer as a ``tokenizers.Tokenizer`` and its tokenizer_config.

llama.cpp keeps the tokenizer as metadata: ``tokenizer.ggml.model`` (the
kind), ``.tokens`` (id -> text), ``.token_type`` (1 normal, 3 control,
4 user-defined, ...), ``.merges`` ("left right" strings, best first),
``.pre`` (the pre-tokenizer's name) and the special token ids. Only
byte-level BPE (``gpt2``: GPT-2, SmolLM, Llama 3, Qwen) is built here; other
kinds are refused with a clear error.
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from checkpoint.gguf_metadata import field, require
from checkpoint.tiny_model import byte_symbols

CONTROL, USER_DEFINED = 3, 4

# Split patterns of the pre-tokenizers (``tokenizer.ggml.pre``) whose merges
# were learned on other pieces than GPT-2's; every other name splits as GPT-2.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPLITS = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}


def build_tokenizer(reader) -> Tokenizer:
    """The byte-level BPE tokenizer a GGUF file (``gguf.GGUFReader``) describes.

    Tokens the file spells outside the byte-level alphabet (raw text) are
    respelled byte by byte, as the BPE model expects. Control tokens become
    special added tokens (matched whole, skipped by ``decode``); user-defined
    ones plain added tokens. No BOS is added here: tprun's ``Tokenizer``
    adds it from ``add_bos_token``.
    """
    kind = require(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer {kind!r} is not supported; supported: 'gpt2' "
                         "(byte-level BPE)")
    tokens = require(reader, "tokenizer.ggml.tokens")
    types = field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in require(reader, "tokenizer.ggml.merges")]
    alphabet = set(byte_symbols())
    spelled = [t if set(t) <= alphabet else _respell(t) for t in tokens]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(spelled)}, merges=merges,
                               dropout=None, fuse_unk=False))
    prefix = bool(field(reader, "tokenizer.ggml.add_space_prefix", False))
    split = SPLITS.get(field(reader, "tokenizer.ggml.pre"))
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=prefix)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=prefix, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    # A control token written in raw text is a mislabel: as an added token it
    # would take a new id past the model's vocabulary, so it stays a plain token.
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t, kind in zip(tokens, types)
                            if kind == CONTROL and set(t) <= alphabet])
    tok.add_tokens([AddedToken(t, normalized=False, special=False)
                    for t, kind in zip(tokens, types)
                    if kind == USER_DEFINED and set(t) <= alphabet])
    return tok


def _respell(text: str) -> str:
    symbols = byte_symbols()
    return "".join(symbols[b] for b in text.encode("utf-8"))


def tokenizer_config(reader) -> dict[str, Any]:
    """tokenizer_config.json's fields: special tokens' text, ``add_bos_token``
    (only when the file states it), ``chat_template``."""
    tokens = require(reader, "tokenizer.ggml.tokens")
    config: dict[str, Any] = {}
    for name, key in (("bos_token", "bos"), ("eos_token", "eos"), ("unk_token", "unknown"),
                      ("pad_token", "padding")):
        token_id = field(reader, f"tokenizer.ggml.{key}_token_id")
        if token_id is not None and 0 <= token_id < len(tokens):
            config[name] = tokens[token_id]
    add_bos = field(reader, "tokenizer.ggml.add_bos_token")
    if add_bos is not None:
        config["add_bos_token"] = bool(add_bos)
    template = field(reader, "tokenizer.chat_template")
    if template is not None:
        config["chat_template"] = template
    return config
