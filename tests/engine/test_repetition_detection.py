"""vLLM's ``repetition_detection``: an output ends with finish reason
"repetition" (``stop_reason`` "repetition_detected") once its tokens end in
``min_count`` copies of one pattern of ``min_pattern_size`` to
``max_pattern_size`` tokens. The detector on hand-worked sequences, the
parameters' checks, and the engine on the tiny model: the same greedy
request without the field runs to ``max_tokens``; with it, it ends where a
brute-force reading of the definition first finds a repetition."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import LLM, SamplingParams
from engine.repetition import RepetitionDetectionParams, RepetitionDetector, ends_in_repetition
from engine.request import Request
from ipc.errors import InvalidRequestError


def detects(tokens, max_size, count, min_size=0) -> bool:
    return ends_in_repetition(tokens, RepetitionDetectionParams(
        max_pattern_size=max_size, min_pattern_size=min_size, min_count=count))


def test_pattern_repeated_min_count_times_at_the_end():
    assert detects([1, 2, 3, 1, 2, 3, 1, 2, 3], 3, 3)
    assert detects([9, 8, 5, 6, 5, 6, 5, 6], 3, 3, min_size=2)  # after other tokens
    assert detects([7, 7], 1, 2)  # the smallest: one token, twice


def test_one_copy_short_is_no_repetition():
    assert not detects([1, 2, 3, 1, 2, 3], 3, 3)
    assert not detects([5, 6, 5, 6, 5], 2, 3)  # 2.5 copies
    assert not detects([4, 4], 1, 3)


def test_only_the_tail_counts():
    """A repetition that the last tokens broke ends nothing."""
    assert not detects([1, 2, 1, 2, 1, 2, 9], 2, 3)
    assert not detects([1, 2, 3, 1, 2, 3, 1, 2, 4], 3, 3, min_size=2)


def test_pattern_sizes_at_the_limits():
    tokens = [10, 20, 30, 40] * 2
    assert detects(tokens, 4, 2, min_size=4)  # size == max_pattern_size == min_pattern_size
    assert not detects(tokens, 3, 2)  # its size is above max_pattern_size
    assert not detects([5, 6] * 3, 5, 3, min_size=3)  # size 2 below min_pattern_size
    assert detects([5, 6] * 3, 5, 3, min_size=2)
    # min_pattern_size 0 reads as 1: a run of one token is a pattern of size 1.
    assert detects([3, 3, 3], 2, 3, min_size=0)


def test_size_one_run_also_matches_larger_sizes():
    """Six equal tokens are three copies of a two-token pattern."""
    assert detects([8] * 6, 3, 3, min_size=2)
    assert not detects([8] * 5, 3, 3, min_size=2)


def test_disabled_and_short_outputs():
    assert not detects([1, 1, 1, 1], 0, 0)
    assert not ends_in_repetition([1, 1, 1, 1], RepetitionDetectionParams())
    assert not detects([], 3, 2)


@pytest.mark.parametrize("fields, words", [
    ({"max_pattern_size": 2, "min_pattern_size": 3, "min_count": 2}, "min_pattern_size <="),
    ({"max_pattern_size": -1, "min_count": 2}, ">= 0"),
    ({"max_pattern_size": 3, "min_count": 1}, "min_count must be >= 2"),
    ({"max_pattern_size": 65537, "min_count": 2}, "at most 65536"),
    ({"max_pattern_size": 4, "min_count": 1 << 63}, "must be an int"),
    ({"max_pattern_size": 2.5, "min_count": 2}, "must be an int"),
    ({"max_pattern_size": 2, "min_count": 2, "window": 3}, "unknown"),
])
def test_bad_parameters_name_the_field(fields, words):
    with pytest.raises(InvalidRequestError, match=words) as caught:
        SamplingParams(repetition_detection=fields)
    assert caught.value.param == "repetition_detection"


def test_min_count_has_no_upper_bound_but_the_wire_format():
    """As vLLM's: no upper bound on ``min_count``, nor on ``max_pattern_size
    * min_count`` (the check's cost does not depend on ``min_count``)."""
    for count in (1001, 10 ** 9, (1 << 63) - 1):
        params = SamplingParams(repetition_detection={"max_pattern_size": 65536,
                                                      "min_count": count})
        assert params.repetition_detection.min_count == count
    assert not detects([7] * 50, 4, 1001)


def test_sampling_params_take_vllm_json_shape():
    params = SamplingParams(repetition_detection={"max_pattern_size": 4, "min_count": 3})
    assert params.repetition_detection == RepetitionDetectionParams(max_pattern_size=4,
                                                                    min_count=3)
    again = SamplingParams.from_dict(params.to_dict())
    assert again.repetition_detection == params.repetition_detection


def first_repetition(tokens, max_size, count, min_size) -> int | None:
    """Brute force: the shortest prefix whose last ``size * count`` tokens
    are ``count`` equal blocks of ``size``, for any size in range."""
    for end in range(1, len(tokens) + 1):
        for size in range(max(min_size, 1), max_size + 1):
            if size * count > end:
                break
            blocks = [tuple(tokens[end - (c + 1) * size:end - c * size]) for c in range(count)]
            if len(set(blocks)) == 1:
                return end
    return None


def brute_force_verdict(tokens, max_size, count, min_size) -> bool:
    """The definition read literally: some size in range whose last
    ``count`` blocks of that size are equal."""
    for size in range(max(min_size, 1), max_size + 1):
        if size * count > len(tokens):
            break
        end = len(tokens)
        blocks = {tuple(tokens[end - (c + 1) * size:end - c * size]) for c in range(count)}
        if len(blocks) == 1:
            return True
    return False


@st.composite
def detections(draw):
    """Small vocabularies (repetitions are common), sizes, counts, and the
    steps the tokens arrive in: one at a time or several (accepted drafts)."""
    max_size = draw(st.integers(1, 12))
    min_size = draw(st.integers(0, max_size))
    count = draw(st.integers(2, 5))
    vocab = draw(st.integers(1, 4))
    tokens = draw(st.lists(st.integers(0, vocab - 1), max_size=80))
    steps = draw(st.lists(st.integers(1, 6), min_size=len(tokens), max_size=len(tokens)))
    return tokens, max_size, count, min_size, steps


@settings(max_examples=600, deadline=None)
@given(detections())
def test_detector_agrees_with_brute_force_fed_token_by_token(case):
    tokens, max_size, count, min_size, _ = case
    detector = RepetitionDetector(RepetitionDetectionParams(
        max_pattern_size=max_size, min_pattern_size=min_size, min_count=count))
    for end, token in enumerate(tokens, start=1):
        want = brute_force_verdict(tokens[:end], max_size, count, min_size)
        assert detector.append(token) == want
        assert detector.repeating == want


@settings(max_examples=600, deadline=None)
@given(detections())
def test_detector_agrees_with_brute_force_fed_several_tokens_a_step(case):
    """Tokens that arrive several a step (a step's accepted drafts) and a
    verdict read only at each step's end, as where ``min_tokens`` holds the
    check back: the verdict still matches the whole output so far."""
    tokens, max_size, count, min_size, steps = case
    request = Request("r", [1, 2], SamplingParams(repetition_detection={
        "max_pattern_size": max_size, "min_pattern_size": min_size, "min_count": count}))
    end = 0
    for step in steps:
        if end >= len(tokens):
            break
        for token in tokens[end:end + step]:
            request.append_output_token(token)
        end = min(end + step, len(tokens))
        assert request.output_token_ids == tokens[:end]
        assert request.repetition.repeating == brute_force_verdict(tokens[:end], max_size,
                                                                   count, min_size)


@st.composite
def long_detections(draw):
    """Counts and sizes large enough that a size enters the range the
    output's length allows (``c * L`` tokens) well after its run began:
    outputs over one or two symbols, or a short pattern repeated with
    breaks, with counts up to 12."""
    max_size = draw(st.integers(4, 24))
    min_size = draw(st.integers(0, max_size))
    count = draw(st.integers(2, 12))
    period = draw(st.integers(1, 6))
    pattern = draw(st.lists(st.integers(0, 1), min_size=period, max_size=period))
    length = draw(st.integers(1, 240))
    breaks = draw(st.sets(st.integers(0, length - 1), max_size=4))
    tokens = [2 if i in breaks else pattern[i % period] for i in range(length)]
    return tokens, max_size, count, min_size


@settings(max_examples=300, deadline=None)
@given(long_detections())
def test_detector_agrees_with_brute_force_on_long_periodic_outputs(case):
    tokens, max_size, count, min_size = case
    detector = RepetitionDetector(RepetitionDetectionParams(
        max_pattern_size=max_size, min_pattern_size=min_size, min_count=count))
    for end, token in enumerate(tokens, start=1):
        assert detector.append(token) == brute_force_verdict(tokens[:end], max_size, count,
                                                             min_size)


class _CountedEnds(array):
    """The detector's ``earlier`` links, counting the reads of its walk."""

    reads = 0

    def __getitem__(self, index):
        type(self).reads += 1
        return super().__getitem__(index)


def test_a_large_min_count_costs_no_walk_over_the_window():
    """A size L can repeat only once ``min_count * L`` tokens are out, so a
    token's check visits the earlier copies of its gram among the last
    ``n // min_count`` tokens, not among the last ``max_pattern_size``: an
    output of one token repeated, under a ``min_count`` no output reaches,
    follows no size and reads no earlier copy (a walk over the window would
    read every earlier end: about n a token), and its verdict stays the
    brute force's."""
    params = RepetitionDetectionParams(max_pattern_size=65536, min_pattern_size=4,
                                       min_count=10 ** 6)
    detector = RepetitionDetector(params)
    detector.earlier = _CountedEnds("q")
    _CountedEnds.reads = 0
    for token in [7] * 6000:
        assert not detector.append(token)
    assert detector.limit == 0 and detector.runs == {}
    assert _CountedEnds.reads == 0
    # the same walk where sizes do come into range: at most one read a
    # followed size a token (here min_count 2: sizes up to n // 2)
    detector = RepetitionDetector(RepetitionDetectionParams(
        max_pattern_size=64, min_pattern_size=4, min_count=3))
    detector.earlier = _CountedEnds("q")
    _CountedEnds.reads = 0
    tokens = [i % 5 for i in range(600)]
    for end, token in enumerate(tokens, start=1):
        assert detector.append(token) == brute_force_verdict(tokens[:end], 64, 3, 4)
    assert _CountedEnds.reads <= 600 * (64 // 5 + 1)


PROMPT = "Hello world"  # the tiny model's greedy output repeats a 5-token pattern
DETECT = {"max_pattern_size": 6, "min_pattern_size": 3, "min_count": 2}


@pytest.mark.timeout(180)
def test_greedy_output_ends_at_its_first_repetition():
    with LLM(model="tiny", device="cpu", max_num_seqs=4) as llm:
        plain, detected = llm.generate(
            [PROMPT, PROMPT],
            [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
             SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True,
                            repetition_detection=DETECT)])
    full = plain.outputs[0].token_ids
    assert plain.outputs[0].finish_reason == "length" and len(full) == 40
    end = first_repetition(full, 6, 2, 3)
    assert end is not None and end < 40
    out = detected.outputs[0]
    assert out.token_ids == full[:end]
    assert out.finish_reason == "repetition"
    assert out.stop_reason == "repetition_detected"


@pytest.mark.timeout(180)
def test_drafted_steps_end_at_the_same_token():
    """With n-gram drafts, several tokens are appended a step (the second
    copy of the greedy output's pattern is drafted from the first); the
    output still ends on the token that completes the first repetition,
    the step's later accepted tokens dropped."""
    ngram = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
             "prompt_lookup_min": 2}
    with LLM(model="tiny", device="cpu", max_num_seqs=4) as llm:
        (plain,) = llm.generate([PROMPT], SamplingParams(temperature=0.0, max_tokens=60,
                                                         ignore_eos=True))
    with LLM(model="tiny", device="cpu", max_num_seqs=4, speculative_config=ngram) as llm:
        (detected,) = llm.generate([PROMPT], SamplingParams(
            temperature=0.0, max_tokens=60, ignore_eos=True, repetition_detection=DETECT))
        assert llm.engine.scheduler.spec_stats.num_accepted_tokens > 0
    full = plain.outputs[0].token_ids
    end = first_repetition(full, 6, 2, 3)
    assert end is not None and end < 60
    assert detected.outputs[0].token_ids == full[:end]
    assert detected.outputs[0].finish_reason == "repetition"
