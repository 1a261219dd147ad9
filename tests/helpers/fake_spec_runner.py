"""A fake runner with speculative decoding, for the scheduler tests.

It plays the real runner's side: it holds each request's true computed
count (the "device" count) and checks the plan's count of a cached
request, which must be an upper bound (at most k above the truth). A
decoding request scheduled for n tokens verifies n - 1 drafts: the runner
writes its last token and the drafts into the KV slots of the true
positions (the blocks must cover them), checks that every earlier slot holds
the request's true tokens and that every draft sits below
``draft_max_model_len``, and accepts drafts while they equal the true
next tokens; it emits the accepted drafts plus one true token. Drafts are
right or wrong by a hash, so runs of every length are accepted.
"""

from __future__ import annotations

import zlib

from ipc.messages import ModelRunnerOutput, SchedulerOutput
from tests.helpers.fake_runner import VOCAB, FakeRunner, _RunnerReq


def draft_is_right(tokens: list[int], j: int) -> bool:
    """Whether the j-th draft after ``tokens`` is the true token (about 70%)."""
    return zlib.crc32(bytes([len(tokens) % 251, j])) % 10 < 7


class FakeSpecRunner(FakeRunner):
    def __init__(self, config, k: int, **kw) -> None:
        super().__init__(config, **kw)
        self.k = k
        self.prefill_len: dict[str, int] = {}
        self.num_drafts = 0
        self.num_accepted = 0
        self.max_drafts_in_row = 0

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        for new in out.scheduled_new_reqs:
            self.prefill_len[new.req_id] = len(new.prefill_token_ids)
        cached = out.scheduled_cached_reqs
        assert cached.num_computed_tokens is not None, "spec plans carry the host counts"
        for rid, computed in zip(cached.req_ids, cached.num_computed_tokens):
            truth = self.reqs[rid].computed
            assert truth <= computed <= truth + self.k, "host count not a bound"
        return super().execute(out)

    def run_request(self, r: _RunnerReq, n: int) -> list[int]:
        rid = next(key for key, value in self.reqs.items() if value is r)
        if r.computed < self.prefill_len[rid]:
            assert r.computed + n <= self.prefill_len[rid], "a prefill chunk with drafts"
            return super().run_request(r, n)
        assert n - 1 <= self.k
        self.max_drafts_in_row = max(self.max_drafts_in_row, n - 1)
        # Inputs: the last token (position computed), then the drafts.
        truth = list(r.tokens)
        drafts, accepted = [], 0
        for j in range(n - 1):
            nxt = self.next_token(truth)
            right = draft_is_right(truth, j)
            drafts.append(nxt if right else (nxt + 1) % VOCAB)
            truth.append(nxt)
        inputs = [r.tokens[r.computed]] + drafts
        assert r.computed + n <= self.cfg.max_model_len
        # Drafts at positions computed + 1 .. computed + n - 1.
        assert n == 1 or r.computed + n <= self.cfg.draft_max_model_len, "a draft past the limit"
        for j, token in enumerate(inputs):
            self.kv[self.slot(r, r.computed + j)] = token
        for pos in range(r.computed):  # "attention" reads every earlier slot
            assert self.kv[self.slot(r, pos)] == r.tokens[pos]
        emitted = []
        for d in drafts:
            t = self.next_token(r.tokens)
            if d != t:
                break
            r.tokens.append(t)
            emitted.append(t)
        accepted = len(emitted)
        t = self.next_token(r.tokens)
        r.tokens.append(t)
        emitted.append(t)
        r.computed += 1 + accepted
        self.num_drafts += n - 1
        self.num_accepted += accepted
        return emitted
