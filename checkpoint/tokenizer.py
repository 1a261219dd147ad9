"""Text <-> token ids, from a model directory's ``tokenizer.json``.

BOS: when ``tokenizer_config.json`` has ``add_bos_token``, that flag alone
decides (the tokenizer's own post-processor is bypassed, so BOS is never
doubled). When the key is absent, ``tokenizer.json``'s post-processor
decides, as in Hugging Face (a plain byte-level tokenizer adds nothing).
``decode`` skips special tokens unless told not to (vLLM's
``skip_special_tokens``).
"""

from __future__ import annotations

import json
import os
from typing import Any

import tokenizers

# Tokens of prompt context the incremental detokenizer starts from: enough
# for decoders that drop a leading space on the first token they see.
_CONTEXT_TOKENS = 5


def _token_text(entry: Any) -> str | None:
    """tokenizer_config.json stores special tokens as a string or as an
    AddedToken dict with a "content" field."""
    if isinstance(entry, dict):
        return entry.get("content")
    return entry if isinstance(entry, str) else None


def _read_json(path: str) -> dict[str, Any]:
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class Tokenizer:
    """A ``tokenizers.Tokenizer`` plus the BOS/EOS facts the engine needs."""

    def __init__(
        self,
        hf_tokenizer: tokenizers.Tokenizer,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        add_bos_token: bool | None = None,
        chat_template: str | None = None,
    ) -> None:
        self.hf = hf_tokenizer
        # A Jinja2 template (transformers' convention) that renders a list of
        # chat messages into a prompt; None when the model ships none.
        self.chat_template = chat_template
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.add_bos_token = add_bos_token
        self.vocab_size = hf_tokenizer.get_vocab_size(with_added_tokens=True)
        if add_bos_token and bos_token_id is None:
            raise ValueError("add_bos_token is set but the tokenizer has no bos_token")

    @classmethod
    def from_dir(cls, model_dir: str) -> Tokenizer:
        path = os.path.join(model_dir, "tokenizer.json")
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"no tokenizer.json in {model_dir!r}: tprun needs a Hugging Face fast "
                f"tokenizer file (save one with tokenizer.save_pretrained)"
            )
        hf = tokenizers.Tokenizer.from_file(path)
        config = _read_json(os.path.join(model_dir, "tokenizer_config.json"))
        special = _read_json(os.path.join(model_dir, "special_tokens_map.json"))

        def token_id(name: str) -> int | None:
            text = _token_text(config.get(name)) or _token_text(special.get(name))
            return None if text is None else hf.token_to_id(text)

        add_bos = config.get("add_bos_token")
        return cls(
            hf,
            bos_token_id=token_id("bos_token"),
            eos_token_id=token_id("eos_token"),
            add_bos_token=None if add_bos is None else bool(add_bos),
            chat_template=config.get("chat_template"),
        )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The text's ids; with ``add_special_tokens`` False, no BOS or other
        token the post-processor would add (the text's own tokens only)."""
        if not add_special_tokens:
            return self.hf.encode(text, add_special_tokens=False).ids
        if self.add_bos_token is None:
            return self.hf.encode(text, add_special_tokens=True).ids
        ids = self.hf.encode(text, add_special_tokens=False).ids
        if self.add_bos_token:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int | None) -> str | None:
        """The text of one token id (special tokens included), e.g. for a
        chat template's ``bos_token`` / ``eos_token`` variables."""
        return None if token_id is None else self.hf.id_to_token(token_id)


class IncrementalDetokenizer:
    """Turns a stream of token ids into text pieces, never splitting a
    multi-byte character: a piece is released only once the text decoded so
    far does not end in U+FFFD (an incomplete UTF-8 sequence).

    Keeps a window ``[prefix_offset, read_offset)`` of already released
    tokens before the unreleased ones and decodes only the window, so each
    step costs O(window), not O(output). The concatenated pieces, ``finish()``
    included, equal ``tokenizer.decode(output ids, skip_special_tokens)``
    for byte-level tokenizers.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int] = (),
                 skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._ids = list(prompt_token_ids)[-_CONTEXT_TOKENS:]
        if self._decode(self._ids).endswith("\ufffd"):
            # The prompt ends inside a character (a token-id prompt): the
            # output's first bytes would complete it and vanish into it.
            self._ids = []
        self._num_context = len(self._ids)
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self.output_text = ""

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, self.skip_special_tokens)

    def finish(self) -> str:
        """The text held back so far (an incomplete character at the end
        of a finished output), so that ``output_text`` becomes the full
        decode of the output ids; "" when the full decode does not extend
        what was released."""
        full = self._decode(self._ids[self._num_context :])
        rest = full[len(self.output_text) :] if full.startswith(self.output_text) else ""
        self.output_text += rest
        return rest

    def feed(self, token_ids: list[int]) -> str:
        """Add new tokens; return the text they complete (may be "")."""
        self._ids.extend(token_ids)
        decode = self._decode
        prefix_text = decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = decode(self._ids[self._prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""
        piece = new_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self.output_text += piece
        return piece
