"""vLLM's ``repetition_detection``: an output ends with finish reason
"repetition" (``stop_reason`` "repetition_detected") once its tokens end in
``min_count`` copies of one pattern of ``min_pattern_size`` to
``max_pattern_size`` tokens. The detector on hand-worked sequences, the
parameters' checks, and the engine on the tiny model: the same greedy
request without the field runs to ``max_tokens``; with it, it ends where a
brute-force reading of the definition first finds a repetition."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.repetition import RepetitionDetectionParams, ends_in_repetition
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
    ({"max_pattern_size": 4, "min_count": 1001}, "at most 1000"),
    ({"max_pattern_size": 65536, "min_count": 11}, "scan budget"),
    ({"max_pattern_size": 2.5, "min_count": 2}, "must be an int"),
    ({"max_pattern_size": 2, "min_count": 2, "window": 3}, "unknown"),
])
def test_bad_parameters_name_the_field(fields, words):
    with pytest.raises(InvalidRequestError, match=words) as caught:
        SamplingParams(repetition_detection=fields)
    assert caught.value.param == "repetition_detection"


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
