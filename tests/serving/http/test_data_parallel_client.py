"""``DataParallelClient`` in process, over two replica links that answer
at once: a reply queue keeps its replica for its whole life, so a beam
search's steps stay on the replica whose prefix cache holds their tokens,
whatever the load does between steps.
"""

from __future__ import annotations

import asyncio
import gc
import types

import pytest

from engine.beam_search import BeamSearchParams
from ipc.engine_messages import Delta, EngineStats, RequestAccepted, TokenLogprob
from serving.data_parallel_client import DataParallelClient
from serving.http.beam_search import beam_search


class OneTokenLink:
    """A replica that accepts each request and answers it at once with one
    token and four candidates (what a beam search step asks for); it keeps
    the id of each request it was sent, and runs ``on_submit`` first."""

    def __init__(self, on_submit=None) -> None:
        self.sent: list[str] = []
        self.on_submit = on_submit

    def submit(self, request_id, prompt_token_ids, params, queue, *args, **kwargs) -> None:
        if self.on_submit is not None:
            self.on_submit()
        self.sent.append(request_id)
        queue.put_nowait(RequestAccepted(request_id=request_id,
                                         prompt_token_ids=list(prompt_token_ids or [])))
        candidates = [TokenLogprob(t, -0.1 * t, t - 4) for t in (5, 6, 7, 8)]
        queue.put_nowait(Delta(request_id=request_id, token_ids=[5], text="x", finished=True,
                               finish_reason="length", logprobs=[candidates]))

    def abort(self, request_id: str) -> None:
        pass

    forget = abort


@pytest.mark.timeout(30)
def test_a_beam_searchs_steps_stay_on_its_first_replica():
    """Another request on replica 0 sends the search's first step to
    replica 1; that request then finishes, so replica 0 has the fewest
    unfinished requests for every later step: they go to replica 1 all the
    same, where the earlier steps' tokens are cached."""
    replicas = [OneTokenLink(), None]
    link = DataParallelClient(replicas)
    replicas[1] = OneTokenLink(on_submit=lambda: link.forget("other"))

    async def run():
        link.submit("other", [1, 2], {}, asyncio.Queue())
        assert link.unfinished == [1, 0]
        state = types.SimpleNamespace(link=link, eos_token_ids=[0], max_model_len=64)
        params = BeamSearchParams(beam_width=2, max_tokens=4, ignore_eos=True)
        return await beam_search(state, [[1, 2, 3]], params, priority=0)

    outputs, _ = asyncio.run(run())
    assert len(outputs[0].sequences) == 2
    assert replicas[0].sent == ["other"]
    assert len(replicas[1].sent) == 1 + 2 + 2 + 2  # one beam, then two at each later step
    assert link.unfinished == [0, 0] and link.replica_of == {}


def test_a_queues_replica_is_forgotten_with_the_queue():
    link = DataParallelClient([OneTokenLink(), OneTokenLink()])
    queue = asyncio.Queue()
    link.submit("a", [1], {}, queue)
    link.forget("a")
    assert dict(link.queue_replica) == {queue: 0}
    del queue
    gc.collect()
    assert len(link.queue_replica) == 0


class StatsLink:
    """A replica that answers ``stats`` with ``stats``."""

    def __init__(self, stats: EngineStats) -> None:
        self.answer = stats

    async def stats(self) -> EngineStats:
        return self.answer


def test_stats_are_every_replicas_together_worked_by_hand():
    """Counts and counters add up (each LoRA adapter's requests too); KV
    usage is the blocks in use over all blocks ((25 + 150) / 400, not the
    mean of 25% and 50%) and the prefix hit rate the hits over all lookups
    (20 / 60, not the mean of 50% and 0%)."""
    a = EngineStats(num_running=2, num_waiting=1, num_blocks=100, num_free_blocks=75,
                    kv_usage=0.25, prefix_hit_rate=0.5, num_preemptions=1, num_steps=10,
                    num_prompt_tokens=40, num_generation_tokens=30, num_scheduled_tokens=70,
                    prefix_cache_queries=40, prefix_cache_hits=20, spec_decode_num_drafts=5,
                    spec_decode_num_draft_tokens=15, spec_decode_num_accepted_tokens=6,
                    spec_decode_num_accepted_tokens_per_pos=[3, 2, 1],
                    running_lora_adapters={"sql": 2}, waiting_lora_adapters={"chat": 1})
    b = EngineStats(num_running=1, num_waiting=0, num_blocks=300, num_free_blocks=150,
                    kv_usage=0.5, prefix_hit_rate=0.0, num_preemptions=0, num_steps=7,
                    num_prompt_tokens=20, num_generation_tokens=12, num_scheduled_tokens=32,
                    num_refused_messages=2, prefix_cache_queries=20, prefix_cache_hits=0,
                    spec_decode_num_drafts=2, spec_decode_num_draft_tokens=6,
                    spec_decode_num_accepted_tokens=4,
                    spec_decode_num_accepted_tokens_per_pos=[2, 1, 1],
                    running_lora_adapters={"chat": 1, "sql": 1})
    link = DataParallelClient([StatsLink(a), StatsLink(b)])
    total = asyncio.run(link.stats())
    assert total == EngineStats(
        num_running=3, num_waiting=1, num_blocks=400, num_free_blocks=225, kv_usage=0.4375,
        prefix_hit_rate=pytest.approx(1 / 3), num_preemptions=1, num_steps=17,
        num_prompt_tokens=60, num_generation_tokens=42, num_scheduled_tokens=102,
        num_refused_messages=2, prefix_cache_queries=60, prefix_cache_hits=20,
        spec_decode_num_drafts=7, spec_decode_num_draft_tokens=21,
        spec_decode_num_accepted_tokens=10, spec_decode_num_accepted_tokens_per_pos=[5, 3, 2],
        running_lora_adapters={"sql": 3, "chat": 1}, waiting_lora_adapters={"chat": 1})
    assert asyncio.run(link.stats_by_engine()) == [a, b]


class SleepyLink:
    """A replica that answers engine control calls (sleep mode) as an
    engine would, keeping whether it sleeps; ``refuse`` makes it answer
    every call with an error, or ``stopped`` fail as a stopped engine."""

    def __init__(self, refuse: str | None = None, stopped: bool = False) -> None:
        self.sleeping = False
        self.refuse = refuse
        self.stopped = stopped

    async def control(self, method, level=1, tags=None):
        from ipc.engine_messages import ControlDone
        from serving.protocol_core import EngineStoppedError

        if self.stopped:
            raise EngineStoppedError("gone")
        if self.refuse is not None:
            return ControlDone(method=method, value=self.sleeping, error=self.refuse)
        if method == "sleep":
            self.sleeping = True
        elif method == "wake_up":
            self.sleeping = False
        return ControlDone(method=method, value=self.sleeping)


@pytest.mark.timeout(30)
def test_control_calls_reach_every_replica_in_order():
    from serving.protocol_core import EngineStoppedError

    replicas = [SleepyLink(), SleepyLink()]
    link = DataParallelClient(replicas)

    async def run():
        answers = await link.controls_by_engine("sleep", level=2)
        assert [(a.method, a.value) for a in answers] == [("sleep", True)] * 2
        assert all(r.sleeping for r in replicas)
        await link.controls_by_engine("wake_up", tags=["weights", "kv_cache"])
        assert not any(r.sleeping for r in replicas)
        refused = DataParallelClient([SleepyLink(), SleepyLink(refuse="no")])
        assert [a.error for a in await refused.controls_by_engine("sleep")] == [None, "no"]
        gone = DataParallelClient([SleepyLink(), SleepyLink(stopped=True)])
        with pytest.raises(EngineStoppedError, match="data-parallel replica 1: gone"):
            await gone.controls_by_engine("is_sleeping")

    asyncio.run(run())
