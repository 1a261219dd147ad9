"""The engine's side of prompt logprobs.

What they cost. A scored prompt position sends ``k + 1`` entries (its top
``k``, the whole vocabulary for -1, and the prompt token's own logprob and
rank), each 12 bytes on the device (an int64 id, a float32 logprob) and as
much in the host copy, then about 70 bytes as Python lists while the
step's reply is built, sent and read. A prompt of L tokens scored at once
would hold ``(L - 1) * (k + 1)`` entries in one step: for -1 with a
128k-token vocabulary, 16 positions are already 2M entries (24 MiB on the
device, about 150 MB of Python lists), and a step's whole token budget
(8192 on CUDA) 1G entries. So, as vLLM scores them chunk by chunk with the
prefill, the scheduler holds every step's scoring to
``ENTRIES_PER_STEP`` entries (``Scheduler``: a request that asks for many
scores its prompt over more, smaller prefill chunks; a request's
``prompt_logprob_width`` is its ``k + 1``, ``entries_per_position``).
The values do not depend on the chunking. What a request keeps is its
answer: ``(L - 1) * (k + 1)`` entries, built here as they come, which is
what the client asked for (-1 needs ``max_logprobs`` -1).

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
from ipc.messages import WHOLE_VOCAB, PromptLogprobs

# The most prompt-logprob entries (scored positions times their width) one
# step computes, on the device and in its reply: 24 MiB of device tensors.
ENTRIES_PER_STEP = 1 << 21


def entries_per_position(num_top: int | None, vocab_size: int) -> int:
    """The entries one scored prompt position sends for a request whose
    ``prompt_logprobs`` is ``num_top`` (None: none, 0; ``WHOLE_VOCAB``: the
    vocabulary): its top entries, at most the vocabulary, and the prompt
    token's own."""
    if num_top is None:
        return 0
    return (vocab_size if num_top == WHOLE_VOCAB else min(num_top, vocab_size)) + 1


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
