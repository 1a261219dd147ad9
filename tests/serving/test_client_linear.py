"""``EngineClient`` gathers a completion's text and logprobs without
copying them whole for each delta: a long completion streamed one token a
delta (a stand-in for the engine's stream), the memory each delta's
handling allocates at its peak (``tracemalloc``, no clock), summed, about
doubles when the completion does, where copying the text or the logprobs
so far at each delta would quadruple it. The completion is the deltas'
text joined, with one logprobs entry per token, in order."""

from __future__ import annotations

import pytest

from engine.outputs import Logprob
from engine.request_metrics import RequestTimes
from engine.sampling_params import SamplingParams
from ipc.engine_messages import Delta, TokenLogprob
from serving.client import EngineClient
from serving.completion_collector import CompletionCollector
from tests.helpers.allocations import Allocations


def _deltas(n: int) -> list[Delta]:
    words = ["Some ", "words ", "of ", "text. "] * n
    return [Delta(request_id="r", token_ids=[i], text=word, finished=i == len(words) - 1,
                  finish_reason="length" if i == len(words) - 1 else None,
                  logprobs=[[TokenLogprob(i, -0.5, 1)]])
            for i, word in enumerate(words)]


def _stream(deltas: list[Delta], count: Allocations):
    """The engine's stream of ``deltas``; the client's work on each is counted."""
    def timed_stream(request_id: str):
        for delta in deltas:
            with count.piece():
                yield 0.0, delta
    return timed_stream


@pytest.mark.parametrize("stop", [[], ["never met"]], ids=["no stop strings", "stop strings"])
def test_a_completion_is_not_copied_per_delta(stop):
    allocated = []
    for n in (500, 1000):
        deltas, count = _deltas(n), Allocations()
        client = EngineClient.__new__(EngineClient)  # no engine: its stream is given
        client._timed_stream = _stream(deltas, count)
        with count.tracing():
            choice = CompletionCollector(0, SamplingParams(stop=stop), RequestTimes())
            client._collect_choice(choice, "r")
        completion = choice.completion()
        assert completion.text == "".join(d.text for d in deltas)
        assert completion.token_ids == list(range(len(deltas)))
        assert completion.logprobs == [{i: Logprob(-0.5, 1)} for i in range(len(deltas))]
        assert completion.finish_reason == "length"
        allocated.append(count.total)
    assert allocated[1] <= 2.5 * allocated[0], allocated
