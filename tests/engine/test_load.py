"""Load: 2,000 requests through ``EngineClient`` against ``tprun serve`` at TP=2.

Prompts of 1 to 48 random tokens and 1 to 8 greedy output tokens
(ignore_eos), from a fixed seed, kept ``WINDOW`` in flight. Held: every
request ends exactly once, with exactly its ``max_tokens`` tokens, equal to
the in-process ``LLM`` (TP=1) on the same prompts; no delta arrives for a
request after its end; the engine generated exactly the tokens delivered
and ends with every KV block free. The resident memory (VmRSS) of the
server and of each worker grows less than 5% between the end of the first
200 requests and the end of the run. The figures (wall time, requests/s,
RSS per process) are printed (``pytest -s`` shows them).

The KV cache is held to ``NUM_BLOCKS`` blocks, few enough that the first
200 requests use every one: the cache is allocated with ``torch.empty``,
whose pages become resident only when first written, and the block pool
hands out never-used blocks before it evicts cached prefixes. With the
default (memory-sized) cache, workers' RSS climbs for thousands of requests
as pages are first touched, which is no leak (with prefix caching off it
stays flat) but would hide one.
"""

from __future__ import annotations

import random
import time
from collections import deque

import pytest

from engine import LLM, SamplingParams
from serving.client import EngineClient
from tests.helpers.serve_utils import rss_kib, start_server, stop_server

NUM_REQUESTS = 2000
WARMUP_REQUESTS = 200
WINDOW = 64
NUM_BLOCKS = 384  # block size 16: at most 4 blocks a request, 256 for the window
SEED = 20261129


def make_load(n: int, seed: int) -> tuple[list[dict], list[SamplingParams]]:
    rng = random.Random(seed)
    prompts = [{"prompt_token_ids": [rng.randrange(1, 256) for _ in range(rng.randint(1, 48))]}
               for _ in range(n)]
    params = [SamplingParams(temperature=0.0, max_tokens=rng.randint(1, 8), ignore_eos=True)
              for _ in range(n)]
    return prompts, params


def run_window(client: EngineClient, prompts, params, indices, results: dict) -> None:
    """Run ``indices`` with at most ``WINDOW`` in flight; store each one's
    delta list in ``results`` (a second result for an index fails)."""
    pending = deque(indices)
    inflight: deque[tuple[int, str]] = deque()
    while pending or inflight:
        while pending and len(inflight) < WINDOW:
            i = pending.popleft()
            inflight.append((i, client.submit(prompts[i], params[i], request_id=f"load-{i}")))
        i, rid = inflight.popleft()
        assert i not in results, f"request {i} answered twice"
        results[i] = list(client.stream(rid))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_2000_requests_tp2_match_in_process_and_memory_stays_flat(tmp_path):
    prompts, params = make_load(NUM_REQUESTS, SEED)
    started = time.monotonic()
    with LLM(model="tiny", device="cpu") as llm:
        want = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    reference_s = time.monotonic() - started
    served = start_server(tmp_path, "--nproc-per-node", "2", "serve", "--model", "tiny",
                          "--device", "cpu", "--disable-log-stats",
                          "--num-gpu-blocks-override", str(NUM_BLOCKS))
    results: dict[int, list] = {}
    try:
        pids = served.pids()
        assert len(pids) == 3, pids  # the server and two workers
        with EngineClient(served.endpoint_file, timeout_s=60) as client:
            before = client.stats()
            assert before.num_blocks == NUM_BLOCKS
            started = time.monotonic()
            run_window(client, prompts, params, range(WARMUP_REQUESTS), results)
            rss_warm = {pid: rss_kib(pid) for pid in pids}
            run_window(client, prompts, params, range(WARMUP_REQUESTS, NUM_REQUESTS), results)
            wall_s = time.monotonic() - started
            rss_end = {pid: rss_kib(pid) for pid in pids}
            after = client.stats()  # answered after every delta sent before it
            assert client.num_unrouted_deltas == 0  # nothing after a request's end
            assert client.num_dropped_replies == 0
    finally:
        code, output, leftovers = stop_server(served)
    assert code == 0 and leftovers == [], output[-3000:]

    assert sorted(results) == list(range(NUM_REQUESTS))
    for i, deltas in sorted(results.items()):
        assert [d.finished for d in deltas] == [False] * (len(deltas) - 1) + [True], i
        assert deltas[-1].finish_reason == "length", i
        tokens = [t for d in deltas for t in d.token_ids]
        assert len(tokens) == params[i].max_tokens, i
        assert tokens == want[i], f"request {i}: {tokens} != {want[i]}"
    delivered = sum(p.max_tokens for p in params)
    assert after.num_generation_tokens - before.num_generation_tokens == delivered
    assert after.num_running == after.num_waiting == 0
    assert after.num_free_blocks == after.num_blocks

    print(f"\nload: {NUM_REQUESTS} requests, {delivered} output tokens, TP=2 CPU: "
          f"{wall_s:.1f} s, {NUM_REQUESTS / wall_s:.1f} requests/s "
          f"(in-process TP=1 reference: {reference_s:.1f} s)")
    for pid in pids:
        growth = rss_end[pid] / rss_warm[pid] - 1
        print(f"load: pid {pid} VmRSS after {WARMUP_REQUESTS}: {rss_warm[pid] / 1024:.1f} MiB, "
              f"at the end: {rss_end[pid] / 1024:.1f} MiB ({growth:+.2%})")
    for pid in pids:
        assert rss_end[pid] < rss_warm[pid] * 1.05, (pid, rss_warm[pid], rss_end[pid])
