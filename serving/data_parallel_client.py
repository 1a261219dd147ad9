"""``DataParallelClient``: one front end's link to several engine replicas
(``tprun serve --data-parallel-size D``), with ``AsyncEngineClient``'s face.

Each replica is an ``AsyncEngineClient`` of its own engine endpoint. A new
request goes to the replica with the fewest unfinished engine requests this
client has sent it (ties: the lowest index), as vLLM's data-parallel load
balancing does with its own counts. Every request of one reply queue
goes to the replica its first went to, for as long as the queue exists:
the choices of one HTTP request share a queue (``Generation``), and so do
the steps of one beam search, whose every step reuses the tokens the one
before it left in that replica's prefix cache (``serving.http.beam_search``).

Invariants: ``unfinished[d]`` is the number of request ids in ``replica_of``
that map to d; an id leaves ``replica_of`` once, when it finishes
(``forget``) or is aborted (``abort``). ``dead`` is the first replica's
reason to have stopped, named with its index: once one replica has
stopped, the whole server stops (``tprun serve`` fails fast), so no
request is moved to another. ``stats`` is the replicas' together
(``summed_stats``), ``stats_by_engine`` each one's (``/metrics`` labels
them by replica). ``profile`` starts or stops every replica's profiler.
"""

from __future__ import annotations

import asyncio
import itertools
import weakref

from ipc.engine_messages import EngineStats
from serving.async_client import AsyncEngineClient
from serving.protocol_core import EngineStoppedError


class DataParallelClient:
    def __init__(self, replicas: list[AsyncEngineClient]) -> None:
        if not replicas:
            raise ValueError("a data-parallel client needs at least one replica")
        self.replicas = replicas
        self.unfinished = [0] * len(replicas)
        self.replica_of: dict[str, int] = {}
        # A reply queue -> its replica, forgotten with the queue itself.
        self.queue_replica: weakref.WeakKeyDictionary[asyncio.Queue, int] = (
            weakref.WeakKeyDictionary())
        self.ids = itertools.count()

    async def start(self) -> None:
        for replica in self.replicas:
            await replica.start()

    async def close(self) -> None:
        self.close_now()

    def close_now(self) -> None:
        for replica in self.replicas:
            replica.close_now()

    @property
    def dead(self) -> str | None:
        for index, replica in enumerate(self.replicas):
            if replica.dead is not None:
                return f"data-parallel replica {index}: {replica.dead}"
        return None

    def new_id(self) -> str:
        return f"http-{next(self.ids)}"

    def choose(self) -> int:
        """The replica with the fewest unfinished requests (ties: the lowest index)."""
        return min(range(len(self.replicas)), key=lambda d: (self.unfinished[d], d))

    def submit(self, request_id: str, prompt_token_ids: list[int] | None, params: dict,
               queue: asyncio.Queue, *args, **kwargs) -> None:
        """``AsyncEngineClient.submit`` on ``queue``'s replica (chosen with
        its first request)."""
        index = self.queue_replica.get(queue)
        if index is None:
            index = self.queue_replica[queue] = self.choose()
        self.replica_of[request_id] = index
        self.unfinished[index] += 1
        self.replicas[index].submit(request_id, prompt_token_ids, params, queue,
                                    *args, **kwargs)

    def abort(self, request_id: str) -> None:
        index = self._release(request_id)
        if index is not None:
            self.replicas[index].abort(request_id)

    def stop_request(self, request_id: str) -> None:
        index = self.replica_of.get(request_id)
        if index is not None:
            self.replicas[index].stop_request(request_id)

    def forget(self, request_id: str) -> None:
        index = self._release(request_id)
        if index is not None:
            self.replicas[index].forget(request_id)

    async def stats(self) -> EngineStats:
        """The stats of all the replicas together (``summed_stats``), once
        every one has answered (``EngineStoppedError`` naming a replica
        that does not)."""
        return summed_stats(await self.stats_by_engine())

    async def stats_by_engine(self) -> list[EngineStats]:
        """Each replica's stats, in replica order (``EngineStoppedError``
        naming the replica if one does not answer)."""
        answers = await asyncio.gather(*(r.stats() for r in self.replicas),
                                       return_exceptions=True)
        for index, answer in enumerate(answers):
            if isinstance(answer, EngineStoppedError):
                raise EngineStoppedError(f"data-parallel replica {index}: {answer}")
            if isinstance(answer, BaseException):
                raise answer
        return answers

    async def profile(self, start: bool, profile_prefix: str | None = None) -> None:
        """``AsyncEngineClient.profile`` on every replica at once; returns
        once all have answered (the first failure, naming its replica, raised)."""
        answers = await asyncio.gather(*(r.profile(start, profile_prefix)
                                         for r in self.replicas), return_exceptions=True)
        for index, answer in enumerate(answers):
            if isinstance(answer, EngineStoppedError):
                raise EngineStoppedError(f"data-parallel replica {index}: {answer}")
            if isinstance(answer, RuntimeError):
                raise RuntimeError(f"data-parallel replica {index}: {answer}") from answer
            if isinstance(answer, BaseException):
                raise answer

    async def controls_by_engine(self, method: str, level: int = 1,
                                 tags: list[str] | None = None) -> list:
        """Each replica's answer to one engine control call (sleep mode,
        the prefix cache: every replica's), in replica order
        (``EngineStoppedError`` naming a replica that does not answer)."""
        answers = await asyncio.gather(*(r.control(method, level, tags) for r in self.replicas),
                                       return_exceptions=True)
        for index, answer in enumerate(answers):
            if isinstance(answer, EngineStoppedError):
                raise EngineStoppedError(f"data-parallel replica {index}: {answer}")
            if isinstance(answer, BaseException):
                raise answer
        return answers

    def _release(self, request_id: str) -> int | None:
        """The replica of an unfinished ``request_id``, no longer counted there."""
        index = self.replica_of.pop(request_id, None)
        if index is None:
            return None
        self.unfinished[index] -= 1
        return index


def summed_stats(replicas: list[EngineStats]) -> EngineStats:
    """The replicas' stats as one engine's, each field over all of them:
    the queues (``num_running``, ``num_waiting``), the KV blocks
    (``num_blocks``, ``num_free_blocks``) and every counter since start
    (steps: the replicas' steps together; tokens, preemptions, refused
    messages, prefix-cache lookups and hits, speculative decoding's
    counters, by draft position too, and each LoRA adapter's running and
    waiting requests, adapters in the order the replicas first list them)
    are sums; ``kv_usage`` is the
    fraction of all the blocks in use, and ``prefix_hit_rate`` the hits
    over all the lookups (0 with none), so both weigh each replica by its
    size, not alike."""
    if not replicas:
        raise ValueError("no replica's stats to sum")
    total = {name: sum(getattr(s, name) for s in replicas) for name in _SUMMED}
    num_blocks = total["num_blocks"]
    used = sum(s.kv_usage * s.num_blocks for s in replicas)
    queries, hits = total["prefix_cache_queries"], total["prefix_cache_hits"]
    positions = max(len(s.spec_decode_num_accepted_tokens_per_pos) for s in replicas)
    per_pos = [sum(s.spec_decode_num_accepted_tokens_per_pos[i]
                   for s in replicas if i < len(s.spec_decode_num_accepted_tokens_per_pos))
               for i in range(positions)]
    return EngineStats(**total, kv_usage=used / num_blocks if num_blocks else 0.0,
                       prefix_hit_rate=hits / queries if queries else 0.0,
                       spec_decode_num_accepted_tokens_per_pos=per_pos,
                       running_lora_adapters=_summed_counts(
                           s.running_lora_adapters for s in replicas),
                       waiting_lora_adapters=_summed_counts(
                           s.waiting_lora_adapters for s in replicas))


def _summed_counts(counts) -> dict[str, int]:
    total: dict[str, int] = {}
    for each in counts:
        for name, count in each.items():
            total[name] = total.get(name, 0) + count
    return total


# EngineStats' fields that add up over replicas as they are.
_SUMMED = ("num_running", "num_waiting", "num_blocks", "num_free_blocks", "num_preemptions",
           "num_steps", "num_prompt_tokens", "num_generation_tokens", "num_scheduled_tokens",
           "num_refused_messages", "prefix_cache_queries", "prefix_cache_hits",
           "spec_decode_num_drafts", "spec_decode_num_draft_tokens",
           "spec_decode_num_accepted_tokens")
