"""``CompletionCollector`` and ``RequestCollector`` fed deltas by hand (no
engine): the views of each output kind, a stop string met across deltas
(the abort it calls for, the deltas dropped after it), ``n`` 2 grouped by
index, and a delta view that costs only what is new."""

from __future__ import annotations

import pytest

from engine.outputs import Logprob
from engine.request_metrics import RequestTimes
from engine.sampling_params import RequestOutputKind, SamplingParams
from ipc.engine_messages import Delta, TokenLogprob
from serving.completion_collector import CompletionCollector
from serving.request_collector import RequestCollector
from tests.helpers.allocations import Allocations

CUMULATIVE, DELTA, FINAL_ONLY = RequestOutputKind


def delta(rid: str, token: int, text: str, last: bool = False, **fields) -> Delta:
    return Delta(request_id=rid, token_ids=[token], text=text, finished=last,
                 finish_reason="length" if last else None, **fields)


def collector(kind, n: int = 1, **fields) -> RequestCollector:
    params = SamplingParams(output_kind=kind, n=n, temperature=1.0 if n > 1 else 0.0, **fields)
    return RequestCollector("r", "prompt", params, [RequestTimes() for _ in range(n)])


WORDS = ["He", "llo", ", wo", "rld"]


def feed(request: RequestCollector, index: int = 0) -> list:
    """Feed WORDS one delta at a time (the first with prompt logprobs); the
    output after each."""
    got = []
    for i, word in enumerate(WORDS):
        extra = {"logprobs": [[TokenLogprob(10 + i, -0.5 * (i + 1), 1)]]}
        if i == 0:
            extra["prompt_logprobs"] = [None, [TokenLogprob(3, -1.0, 1)]]
        request.choices[index].add(delta(f"e{index}", 10 + i, word, i == len(WORDS) - 1,
                                         **extra), float(i))
        got.append(request.output())
    return got


def test_cumulative_outputs_hold_everything_so_far():
    request = collector(CUMULATIVE)
    outs = feed(request)
    assert [o.outputs[0].text for o in outs] == ["He", "Hello", "Hello, wo", "Hello, world"]
    assert outs[-1].outputs[0].token_ids == [10, 11, 12, 13]
    assert [o.finished for o in outs] == [False, False, False, True]
    assert all(o.prompt_logprobs == [None, {3: Logprob(-1.0, 1)}] for o in outs)
    assert outs[-1].outputs[0].cumulative_logprob == -0.5 - 1.0 - 1.5 - 2.0
    assert outs[-1].metrics.num_generation_tokens == 4 and outs[0].metrics is None
    assert outs[1].outputs[0].text == "Hello"  # a later delta changes no earlier output
    assert request.output() is None  # nothing new


def test_delta_outputs_hold_only_what_is_new():
    outs = feed(collector(DELTA))
    assert [o.outputs[0].text for o in outs] == WORDS
    assert [o.outputs[0].token_ids for o in outs] == [[10], [11], [12], [13]]
    assert [o.outputs[0].logprobs for o in outs] == [
        [{10 + i: Logprob(-0.5 * (i + 1), 1)}] for i in range(4)]
    assert outs[0].prompt_logprobs == [None, {3: Logprob(-1.0, 1)}]
    assert [o.prompt_logprobs for o in outs[1:]] == [None] * 3
    assert [o.outputs[0].cumulative_logprob for o in outs] == [-0.5, -1.5, -3.0, -5.0]
    assert outs[-1].outputs[0].finish_reason == "length" and outs[-1].finished


def test_final_only_gives_nothing_until_the_end():
    request = collector(FINAL_ONLY)
    outs = feed(request)
    assert outs[:-1] == [None] * 3
    assert outs[-1].finished and outs[-1].outputs[0].text == "Hello, world"


def test_deltas_that_came_meanwhile_make_one_output():
    request = collector(DELTA)
    for i, word in enumerate(WORDS[:3]):
        request.choices[0].add(delta("e0", i, word), 0.0)
    assert request.output().outputs[0].text == "Hello, wo"
    request.choices[0].add(delta("e0", 3, "rld", last=True), 0.0)
    assert request.output().outputs[0].text == "rld"


def test_a_stop_string_across_deltas_cuts_the_text_and_asks_for_the_abort():
    choice = CompletionCollector(0, SamplingParams(stop=["o, w"]), RequestTimes())
    said = [choice.add(delta("e", 10 + i, word), 0.0) for i, word in enumerate(WORDS[:3])]
    assert said == [False, False, True]  # ", wo" completes "o, w": the caller aborts
    late = delta("e", 99, "late", last=True, prompt_logprobs=[None])
    assert choice.add(late, 0.0) is False  # the engine's own last delta: dropped
    whole = choice.completion()
    assert (whole.text, whole.token_ids) == ("Hell", [10, 11, 12])  # to the piece that stopped
    assert (whole.finish_reason, whole.stop_reason) == ("stop", "o, w")
    assert choice.prompt_logprobs == [None]  # the prompt's side is taken from any delta


def test_n_2_outputs_hold_the_choices_with_news_by_index():
    request = collector(DELTA, n=2)
    request.choices[1].add(delta("e1", 20, "b"), 0.0)
    request.choices[0].add(delta("e0", 10, "a"), 0.0)
    first = request.output()
    assert [(c.index, c.text) for c in first.outputs] == [(0, "a"), (1, "b")]
    request.choices[1].add(delta("e1", 21, "B", last=True), 0.0)
    second = request.output()
    assert [(c.index, c.text) for c in second.outputs] == [(1, "B")] and not second.finished
    request.choices[0].add(delta("e0", 11, "A", last=True), 0.0)
    third = request.output()
    assert [(c.index, c.text) for c in third.outputs] == [(0, "A")] and third.finished
    assert [c.token_ids for c in request.final().outputs] == [[10, 11], [20, 21]]
    assert third.metrics.num_generation_tokens == 4


def test_a_delta_view_costs_what_is_new():
    """The memory each delta's handling and view allocate at its peak,
    summed, about doubles when the completion does (a view that copied the
    text or logprobs so far would quadruple it)."""
    allocated = []
    for n in (500, 1000):
        request, count = collector(DELTA), Allocations()
        with count.tracing():
            for i in range(4 * n):
                with count.piece():
                    request.choices[0].add(delta("e", i, WORDS[i % 4], i == 4 * n - 1,
                                                 logprobs=[[TokenLogprob(i, -0.5, 1)]]), 0.0)
                    request.output()
        allocated.append(count.total)
    assert allocated[1] <= 2.5 * allocated[0], allocated


@pytest.mark.parametrize("kind", list(RequestOutputKind))
def test_detokenize_false_leaves_decoded_tokens_none(kind):
    request = RequestCollector("r", None, SamplingParams(output_kind=kind, detokenize=False),
                               [RequestTimes()], tokenizer=object())  # never called
    request.choices[0].add(delta("e", 5, "", last=True, logprobs=[[TokenLogprob(5, -0.1, 1)]]),
                           0.0)
    assert request.output().outputs[0].logprobs == [{5: Logprob(-0.1, 1, None)}]
