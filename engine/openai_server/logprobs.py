"""Log-probabilities in the two OpenAI shapes.

The engine sends, per token, its top-N candidates in rank order and then
the sampled token when it is not among them (``ipc.engine_messages.Delta``).
A token's text here is its own decode (a byte of an incomplete character
decodes to U+FFFD), its ``bytes`` that text's UTF-8.
"""

from __future__ import annotations

from functools import lru_cache

from engine.tokenizer import Tokenizer
from ipc.engine_messages import TokenLogprob


class LogprobsFormatter:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.token_str = lru_cache(maxsize=65536)(lambda t: tokenizer.decode([t]))

    def _split(self, token_id: int, entries: list[TokenLogprob], num_top: int):
        sampled = next((e for e in entries if e.token_id == token_id), None)
        top = [e for e in entries if e.rank is not None and e.rank <= num_top][:num_top]
        return (sampled.logprob if sampled else None), top

    def completion(self, token_ids: list[int], logprobs: list[list[TokenLogprob]],
                   num_top: int, text_offset: int) -> dict:
        """``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``
        for consecutive tokens whose text starts at ``text_offset``."""
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token_id, entries in zip(token_ids, logprobs):
            logprob, top = self._split(token_id, entries, num_top)
            text = self.token_str(token_id)
            out["tokens"].append(text)
            out["token_logprobs"].append(logprob)
            out["top_logprobs"].append({self.token_str(e.token_id): e.logprob for e in top})
            out["text_offset"].append(text_offset)
            text_offset += len(text)
        return out

    def chat(self, token_ids: list[int], logprobs: list[list[TokenLogprob]],
             num_top: int) -> list[dict]:
        """The ``logprobs.content`` entries of consecutive tokens."""
        out = []
        for token_id, entries in zip(token_ids, logprobs):
            logprob, top = self._split(token_id, entries, num_top)
            out.append({**self._entry(token_id, logprob),
                        "top_logprobs": [self._entry(e.token_id, e.logprob) for e in top]})
        return out

    def _entry(self, token_id: int, logprob: float) -> dict:
        text = self.token_str(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}
