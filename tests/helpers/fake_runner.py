"""The scheduler tests' fake runner and the functions that drive a
``Scheduler`` against it, shared by the synchronous and the asynchronous
scheduling tests.

The fake runner holds the requests it was sent and a simulated paged KV
cache (slot -> token written there), and checks before every sample that
the request's KV blocks hold exactly its tokens. Its next token is a
function of the whole sequence, so a wrong prefill, a lost token or a bad
block table changes the outputs; ``reference`` is the plain loop they are
compared with, which knows nothing of scheduling.
"""

from __future__ import annotations

import zlib
from array import array
from collections import defaultdict
from dataclasses import dataclass

from engine.request import Request, check_request
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler, SchedulerConfig
from ipc.messages import ModelRunnerOutput, SchedulerOutput

VOCAB = 50


def hash_token(tokens: list[int]) -> int:
    return zlib.crc32(array("q", tokens).tobytes()) % VOCAB


@dataclass
class _RunnerReq:
    tokens: list[int]
    computed: int
    blocks: list[int]


class FakeRunner:
    def __init__(self, config: SchedulerConfig, next_token=hash_token) -> None:
        self.cfg = config
        self.next_token = next_token
        self.kv: dict[int, int] = {}
        self.reqs: dict[str, _RunnerReq] = {}
        self.history: dict[str, list[int]] = {}  # tokens of preempted requests
        self.max_live = 0
        self.chunked_steps = 0

    def slot(self, r: _RunnerReq, pos: int) -> int:
        bs = self.cfg.block_size
        return r.blocks[pos // bs] * bs + pos % bs

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        for rid in sorted(out.finished_req_ids + out.preempted_req_ids):
            r = self.reqs.pop(rid, None)
            if rid in out.preempted_req_ids:
                assert r is not None, "preempted a request the runner did not hold"
                self.history[rid] = r.tokens
        for new in out.scheduled_new_reqs:
            assert new.req_id not in self.reqs
            if new.req_id in self.history:  # resumed: prompt + generated so far
                assert new.prefill_token_ids == self.history.pop(new.req_id)
            assert new.prefill_token_ids[: len(new.prompt_token_ids)] == new.prompt_token_ids
            r = _RunnerReq(list(new.prefill_token_ids), new.num_computed_tokens, new.block_ids[0])
            self.reqs[new.req_id] = r
            for pos in range(r.computed):  # prefix cache hits must hold our tokens
                assert self.kv[self.slot(r, pos)] == r.tokens[pos]
        cached = out.scheduled_cached_reqs
        for rid, blocks in zip(cached.req_ids, cached.new_block_ids):
            self.reqs[rid].blocks += blocks[0] if blocks else []
        self.max_live = max(self.max_live, len(self.reqs))
        self.check_blocks_exclusive(out)
        sampled = [self.run_request(self.reqs[rid], n)
                   for rid, n in zip(out.scheduled_req_ids(), out.num_scheduled_tokens)]
        return ModelRunnerOutput(step_id=out.step_id, sampled_token_ids=sum(sampled, []),
                                 num_sampled=[len(s) for s in sampled])

    def run_request(self, r: _RunnerReq, n: int) -> list[int]:
        assert 0 < n and r.computed + n <= len(r.tokens)
        assert r.computed + n <= self.cfg.max_model_len
        for pos in range(r.computed, r.computed + n):
            self.kv[self.slot(r, pos)] = r.tokens[pos]
        r.computed += n
        if r.computed < len(r.tokens):
            self.chunked_steps += 1
            return []
        for pos in range(r.computed):  # "attention" reads every earlier slot
            assert self.kv[self.slot(r, pos)] == r.tokens[pos]
        token = self.next_token(r.tokens)
        r.tokens.append(token)
        return [token]

    def check_blocks_exclusive(self, out: SchedulerOutput) -> None:
        """Blocks a request writes this step belong to it alone."""
        owner: dict[int, str] = {}
        bs = self.cfg.block_size
        for rid, n in zip(out.scheduled_req_ids(), out.num_scheduled_tokens):
            r = self.reqs[rid]
            for block in {r.blocks[p // bs] for p in range(r.computed, r.computed + n)}:
                assert owner.setdefault(block, rid) == rid, f"block {block} written twice"


def reference(prompt, params: SamplingParams, eos, max_model_len, next_token=hash_token):
    """Output tokens and finish reason by a plain loop, no scheduling."""
    eos_ids = {eos} if isinstance(eos, int) else set(eos or ())
    tokens, out = list(prompt), []
    while True:
        t = next_token(tokens)
        tokens.append(t)
        out.append(t)
        if t in params.stop_token_ids or (t in eos_ids and not params.ignore_eos):
            return out, "stop"
        if len(out) >= params.max_tokens or len(tokens) >= max_model_len:
            return out, "length"


def drive(sched: Scheduler, runner: FakeRunner, max_steps: int = 5000):
    """Run to completion, checking each step's limits. Returns
    {req_id: (tokens, finish_reason)} and the SchedulerOutputs."""
    cfg = sched.config
    tokens: dict[str, list[int]] = defaultdict(list)
    reasons: dict[str, str] = {}
    outs = []
    while sched.has_unfinished_requests():
        assert len(outs) < max_steps, "no progress"
        out = sched.schedule()
        outs.append(out)
        assert out.step_id == len(outs) - 1
        scheduled = out.scheduled_req_ids()
        assert len(set(scheduled)) == len(scheduled) == len(out.num_scheduled_tokens)
        assert out.total_num_scheduled_tokens <= cfg.max_num_batched_tokens
        assert not set(out.finished_req_ids) & set(scheduled)
        assert not set(out.preempted_req_ids) & set(scheduled)
        assert len(sched.running) <= cfg.max_num_seqs
        sched.kv.pool.check_invariants()
        for delta in sched.update_from_output(out, runner.execute(out)):
            assert delta.req_id not in reasons
            tokens[delta.req_id] += delta.new_token_ids
            if delta.finished:
                reasons[delta.req_id] = delta.finish_reason
    assert sched.kv.pool.num_free_blocks == cfg.num_blocks
    return {rid: (tokens[rid], reasons[rid]) for rid in reasons}, outs


def config(**kw) -> SchedulerConfig:
    base = dict(
        max_num_seqs=8,
        max_num_batched_tokens=64,
        max_model_len=64,
        block_size=4,
        num_blocks=64,
        policy="fcfs",
        enable_prefix_caching=False,
        enable_chunked_prefill=True,
        max_logprobs=-1,
        num_speculative_tokens=0,
        spec_disable_by_batch_size=0,
        vocab_size=256,
        pooled_size=0,
    )
    base.update(kw)
    base.setdefault("draft_max_model_len", base["max_model_len"])
    return SchedulerConfig(**base)


def make_requests(prompts, params, eos=None, priorities=None):
    return [
        Request(
            f"r{i}",
            p,
            params,
            eos_token_id=eos,
            arrival_time=float(i),
            priority=0 if priorities is None else priorities[i],
        )
        for i, p in enumerate(prompts)
    ]


def admit(sched: Scheduler, requests: list[Request]) -> list[Request]:
    """Add each request the engine would accept (``check_request``: longer
    than ``max_model_len`` or more KV blocks than the cache holds is
    refused); returns those added."""
    accepted = []
    for r in requests:
        try:
            check_request(r.prompt_token_ids, r.sampling_params, sched.config)
        except ValueError as e:
            assert "KV blocks" in str(e) or "max_model_len" in str(e)
            continue
        sched.add_request(r)
        accepted.append(r)
    return accepted


def run(cfg, requests, next_token=hash_token):
    sched = Scheduler(cfg)
    for r in requests:
        sched.add_request(r)
    runner = FakeRunner(cfg, next_token)
    results, outs = drive(sched, runner)
    return results, outs, sched, runner


def expected(requests, cfg, next_token=hash_token):
    return {
        r.req_id: reference(
            r.prompt_token_ids, r.sampling_params, r.eos_token_id, cfg.max_model_len, next_token
        )
        for r in requests
    }


PROMPTS = [[(7 * i + j) % VOCAB for j in range(5 + 3 * i)] for i in range(6)]
