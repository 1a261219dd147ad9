"""Log-probabilities in the two OpenAI shapes.

The engine sends, per token, its top-N candidates in rank order and then
the sampled token when it is not among them (``ipc.engine_messages.Delta``).
A token is shown by its own text when its bytes are whole UTF-8, else, as
OpenAI shows them, as ``bytes:\\xNN...``, so two different partial
characters never share a name; ``bytes`` is the token's raw bytes. With
vLLM's ``return_tokens_as_token_ids`` (``as_ids``) every token is named
``token_id:N`` instead (its ``bytes`` and text offsets stay its own).

A token a constraint masks has logprob -inf in the engine's answer, which
JSON cannot carry: every logprob is shown at least ``LOWEST_SHOWN``
(-9999.0, where vLLM's server clamps them), all others as they are.
"""

from __future__ import annotations

import codecs
import re
import sys
from functools import lru_cache

from tokenizers import decoders

from checkpoint.tiny_model import byte_symbols
from checkpoint.tokenizer import Tokenizer
from ipc.engine_messages import TokenLogprob
from ipc.messages import WHOLE_VOCAB

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece byte fallback
LOWEST_SHOWN = -9999.0


def shown(logprob: float) -> float:
    """A logprob as an answer shows it: -inf (a masked token) as ``LOWEST_SHOWN``."""
    return max(logprob, LOWEST_SHOWN)


def _count(num_top: int) -> int:
    """How many top entries ``num_top`` shows: -1 (``WHOLE_VOCAB``) shows
    every one the engine sent, which is the whole vocabulary."""
    return sys.maxsize if num_top == WHOLE_VOCAB else num_top


class TextOffsets:
    """The ``text_offset`` of each token of one choice, in order: the
    characters of all the choice's earlier tokens' bytes, decoded together
    by one incremental UTF-8 decoder. The offsets depend on the tokens alone
    (not on how much text a stop string holds back, nor on how the engine
    split them into deltas); a token that begins a character a later one
    completes adds nothing, so the character is counted once, where it ends;
    bytes that form no character count as U+FFFD (as the text shows them)
    from the token that proves them invalid on."""

    def __init__(self) -> None:
        self.offset = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def take(self, data: bytes) -> int:
        """The offset of the token whose bytes are ``data``; moves past it."""
        at = self.offset
        self.offset += len(self._decoder.decode(data))
        return at


class LogprobsFormatter:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.byte_level = isinstance(tokenizer.hf.decoder, decoders.ByteLevel)
        self.byte_of = {symbol: b for b, symbol in enumerate(byte_symbols())}
        self.label = lru_cache(maxsize=65536)(self._label)

    def _bytes(self, token_id: int) -> bytes:
        raw = self.tokenizer.token_text(token_id) or ""
        if self.byte_level and all(c in self.byte_of for c in raw):
            return bytes(self.byte_of[c] for c in raw)
        if (m := _BYTE_TOKEN.fullmatch(raw)) is not None:
            return bytes([int(m.group(1), 16)])
        return (self.tokenizer.decode([token_id]) or raw).encode("utf-8")

    def _label(self, token_id: int) -> tuple[str, bytes]:
        data = self._bytes(token_id)
        try:
            return data.decode("utf-8"), data
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in data), data

    def token_str(self, token_id: int, as_ids: bool = False) -> str:
        return f"token_id:{token_id}" if as_ids else self.label(token_id)[0]

    def _split(self, token_id: int, entries: list[TokenLogprob], num_top: int,
               listed: bool = False):
        """The token's own shown logprob (None: not sent) and its top
        entries: the top ``num_top`` by rank or, ``listed`` (a request's
        ``logprob_token_ids``, sent in the list's order), the token itself
        first, then every other listed id in the list's order, whatever
        ``num_top`` is (0 too), as vLLM lists them: the list replaces the
        top ones, and ``logprobs`` only turns them on."""
        sampled = next((e for e in entries if e.token_id == token_id), None)
        if listed:
            top = ([sampled] if sampled else []) + [e for e in entries if e.token_id != token_id]
        else:
            num_top = _count(num_top)
            top = [e for e in entries if e.rank is not None and e.rank <= num_top][:num_top]
        return (shown(sampled.logprob) if sampled else None), top

    def completion(self, token_ids: list[int], logprobs: list[list[TokenLogprob] | None],
                   num_top: int, offsets: TextOffsets, as_ids: bool = False,
                   listed: bool = False) -> dict:
        """``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``
        for consecutive tokens of one choice, each offset taken from the
        choice's ``offsets`` (which it advances). A token without entries
        (the first prompt token, echoed) has null logprob and top logprobs.
        As OpenAI's legacy API and vLLM give them, a token's top logprobs
        hold the token itself first, then the top ``num_top`` (so num_top
        + 1 entries where it is not among them; only itself at 0); ``listed``
        (``logprob_token_ids``): itself, then every other id of the list."""
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token_id, entries in zip(token_ids, logprobs):
            data = self.label(token_id)[1]
            text = self.token_str(token_id, as_ids)
            out["tokens"].append(text)
            if entries is None:
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
            else:
                logprob, top = self._split(token_id, entries, num_top, listed)
                out["token_logprobs"].append(logprob)
                candidates = {} if logprob is None else {text: logprob}
                candidates.update((self.token_str(e.token_id, as_ids), shown(e.logprob))
                                  for e in top if e.token_id != token_id)
                out["top_logprobs"].append(candidates)
            out["text_offset"].append(offsets.take(data))
        return out

    def chat(self, token_ids: list[int], logprobs: list[list[TokenLogprob]],
             num_top: int, as_ids: bool = False, listed: bool = False) -> list[dict]:
        """The ``logprobs.content`` entries of consecutive tokens (``listed``:
        as ``_split``)."""
        out = []
        for token_id, entries in zip(token_ids, logprobs):
            logprob, top = self._split(token_id, entries, num_top, listed)
            out.append({**self._entry(token_id, logprob, as_ids),
                        "top_logprobs": [self._entry(e.token_id, shown(e.logprob), as_ids)
                                         for e in top]})
        return out

    def _entry(self, token_id: int, logprob: float, as_ids: bool) -> dict:
        return {"token": self.token_str(token_id, as_ids), "logprob": logprob,
                "bytes": list(self.label(token_id)[1])}

    def prompt_logprobs(self, token_ids: list[int], logprobs: list[list[TokenLogprob] | None],
                        num_top: int) -> list[dict | None]:
        """vLLM's ``prompt_logprobs``: per prompt token (None for the first),
        token id (a JSON key) -> ``{"logprob", "rank", "decoded_token"}`` for
        the top ``num_top`` and the prompt token itself."""
        out: list[dict | None] = []
        for token_id, entries in zip(token_ids, logprobs):
            if entries is None:
                out.append(None)
                continue
            kept = [e for e in entries if e.token_id == token_id
                    or (e.rank is not None and e.rank <= _count(num_top))]
            out.append({str(e.token_id): {"logprob": shown(e.logprob), "rank": e.rank,
                                          "decoded_token": self.tokenizer.decode([e.token_id])}
                        for e in kept})
        return out
