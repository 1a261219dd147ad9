"""The engine's side of prompt logprobs.

Prompt logprobs arrive chunk by chunk (``ipc.messages.PromptLogprobs``),
each entry at its prompt index, so a chunk computed again after a
preemption overwrites what it computed before with the same values. A
request's list (vLLM's shape: None for the first prompt token, then
token id -> ``Logprob`` with the prompt token and the top k) goes out once,
with the request's first sampled tokens: the step that scores the prompt's
last token samples the first output token.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.outputs import Logprob, TokenLogprobs
from engine.request import Request
from ipc.messages import PromptLogprobs


def absorb(requests: Iterable[Request], chunks: PromptLogprobs | None) -> None:
    """Write each scored prompt token's entry into its live request
    (``requests`` maps to those the step's output may still update)."""
    if chunks is None:
        return
    live = {r.req_id: r for r in requests}
    lp = chunks.logprobs
    row = 0
    for req_id, start, count in zip(chunks.req_ids, chunks.starts, chunks.counts):
        request = live.get(req_id)
        if request is not None:
            table = _table(request)
            prompt = request.prompt_token_ids
            for j in range(count):
                r = row + j
                table[start + j] = _entry(prompt[start + j], lp.top_token_ids[r],
                                          lp.top_logprobs[r], lp.sampled_logprobs[r],
                                          lp.sampled_ranks[r])
        row += count


def _table(request: Request) -> list[TokenLogprobs | None]:
    if request.prompt_logprobs is None:
        request.prompt_logprobs = [None] * request.num_prompt_tokens
    return request.prompt_logprobs


def _entry(token: int, top_ids: list[int], top_lps: list[float], logprob: float,
           rank: int) -> TokenLogprobs:
    out = {t: Logprob(v, k) for k, (t, v) in enumerate(zip(top_ids, top_lps), start=1)}
    out[token] = Logprob(logprob, rank)
    return out


def take_ready(request: Request) -> list[TokenLogprobs | None] | None:
    """The request's prompt logprobs, once, when every prompt token is scored."""
    if request.sampling_params.prompt_logprobs is None or request.prompt_logprobs_sent:
        return None
    table = request.prompt_logprobs
    if table is None:
        table = [None] * request.num_prompt_tokens  # a one-token prompt scores nothing
    if any(entry is None for entry in table[1:]):
        return None
    request.prompt_logprobs_sent = True
    return table
