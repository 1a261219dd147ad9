"""SamplingParams: validation messages, normalisation, IPC conversion."""

from __future__ import annotations

import msgspec
import pytest

from engine.sampling_params import RequestOutputKind, SamplingParams
from engine.stop_strings import MAX_STOP_STRINGS
from ipc.errors import InvalidRequestError
from ipc.messages import SamplingOptions


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(temperature=-0.1), "temperature must be >= 0"),
        (dict(temperature="hot"), "temperature must be a number"),
        (dict(temperature=float("nan")), "temperature must be a number"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
        (dict(top_k=-2), "top_k must be >= 0"),
        (dict(top_k=2.0), "top_k must be a 64-bit int"),
        (dict(top_k=2**63), "top_k must be a 64-bit int"),
        (dict(min_p=-0.5), r"min_p must be in \[0, 1\]"),
        (dict(min_p=1.01), r"min_p must be in \[0, 1\]"),
        (dict(max_tokens=0), "max_tokens must be an int >= 1"),
        (dict(max_tokens=3.0), "max_tokens must be an int >= 1"),
        (dict(seed=1.5), "seed must be None or a 64-bit int"),
        (dict(seed=True), "seed must be None or a 64-bit int"),
        (dict(seed=-(2**63) - 1), "seed must be None or a 64-bit int"),
        (dict(max_tokens=2**64), "max_tokens must be an int >= 1"),
        (dict(logprobs=2**63), "logprobs must be None, an int >= 0 or -1"),
        (dict(stop_token_ids=[2**70]), "stop_token_ids must be non-negative ints"),
        (dict(logprobs=-2), "logprobs must be None, an int >= 0 or -1"),
        (dict(repetition_penalty=0.0), "repetition_penalty must be > 0"),
        (dict(presence_penalty=2.5), r"presence_penalty must be in \[-2, 2\]"),
        (dict(frequency_penalty=-3), r"frequency_penalty must be in \[-2, 2\]"),
        (dict(stop_token_ids=[1, -2]), "stop_token_ids must be non-negative ints"),
        (dict(stop_token_ids="12"), "stop_token_ids must be a list of ints"),
        (dict(stop_token_ids=5), "stop_token_ids must be a list of ints"),
        (dict(ignore_eos="yes"), "ignore_eos must be a bool"),
        (dict(n=0), r"n must be in \[1, 128\]"),
        (dict(n=129), r"n must be in \[1, 128\]"),
        (dict(n=2.0), r"n must be in \[1, 128\]"),
        (dict(stop=["ok", ""]), "a stop string must not be empty"),
        (dict(stop=""), "a stop string must not be empty"),
        (dict(stop=[3]), "stop must be a string or a list of strings"),
        (dict(stop=7), "stop must be a string or a list of strings"),
        (dict(max_tokens=None, min_tokens=1.5), "min_tokens must be an int"),
        (dict(truncate_prompt_tokens=0), "truncate_prompt_tokens must be None, an int >= 1 or -1"),
        (dict(truncate_prompt_tokens=-2), "truncate_prompt_tokens must be None, an int >= 1 or -1"),
        (dict(include_stop_str_in_output=1), "include_stop_str_in_output must be a bool"),
        (dict(detokenize=0), "detokenize must be a bool"),
        (dict(detokenize=False, stop=["\n"]), "stop strings need the output's text"),
        (dict(logit_bias={1: "x"}), "logit_bias must map token ids"),
        (dict(allowed_token_ids="12"), "allowed_token_ids must be a list of ints"),
        (dict(output_kind=3), "output_kind must be a RequestOutputKind"),
        (dict(output_kind="DELTA"), "output_kind must be a RequestOutputKind"),
        (dict(output_kind=True), "output_kind must be a RequestOutputKind"),
        (dict(output_kind=None), "output_kind must be a RequestOutputKind"),
    ],
)
def test_invalid_values_raise_clear_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kw)


@pytest.mark.parametrize("kw", [dict(n=2, temperature=0), dict(n=128, temperature=0.0),
                                dict(n=3, temperature=0.0, seed=4)])
def test_greedy_takes_n_1_only(kw):
    """vLLM's rule: at temperature 0 every choice is the same argmax, so
    ``n`` above 1 is refused, naming ``n`` (OpenAI's ``param``), whether
    built, assigned after and checked, or read from a dict."""
    with pytest.raises(InvalidRequestError, match=rf"^n must be 1 when sampling greedily "
                                                  rf"\(temperature 0\), got {kw['n']}") as e:
        SamplingParams(**kw)
    assert e.value.param == "n"
    with pytest.raises(InvalidRequestError, match="n must be 1 when sampling greedily"):
        SamplingParams.from_dict(kw)
    assigned = SamplingParams(n=kw["n"], temperature=0.7)
    assigned.temperature = 0.0
    with pytest.raises(InvalidRequestError, match="n must be 1 when sampling greedily"):
        assigned.checked()
    # Sampled (any temperature above 0, the raised floor's too) and greedy n 1 stay served.
    assert SamplingParams(n=kw["n"], temperature=0.001).temperature == 0.01
    assert SamplingParams(n=1, temperature=0).choices()[0].temperature == 0


@pytest.mark.parametrize("given, stored", [
    (0, 0), (0.0, 0.0), (1e-9, 0.01), (0.001, 0.01), (0.00999, 0.01), (0.01, 0.01), (0.5, 0.5)])
def test_a_tiny_temperature_is_raised_to_vllms_floor(given, stored, caplog):
    """vLLM's rule, hand-worked: 0 stays greedy; a temperature above 0 but
    below 0.01 samples at 0.01, said once in the log; the copies the
    parameters go through (``checked``, ``choices``) say nothing more."""
    with caplog.at_level("WARNING", logger="engine.sampling_params"):
        p = SamplingParams(temperature=given, n=1 if given == 0 else 3, seed=1)  # greedy: n 1
        p.checked(), p.choices(), SamplingParams.from_dict(p.to_dict())
    assert p.temperature == stored
    assert all(c.temperature == stored for c in p.choices())
    raised = [r for r in caplog.records if "temperature" in r.getMessage()]
    assert len(raised) == (stored != given)
    if raised:
        assert f"temperature {given} is below 0.01" in raised[0].getMessage()
    q = SamplingParams(temperature=1.0)
    q.temperature = 0.004  # assigned after construction: the copy the engine takes
    assert q.checked().temperature == 0.01


def test_edges_are_accepted():
    p = SamplingParams(
        temperature=0, top_p=1, top_k=0, min_p=1.0, max_tokens=1, seed=0, logprobs=0,
        presence_penalty=-2, frequency_penalty=2, repetition_penalty=0.01,
    )  # fmt: skip
    assert p.temperature == 0 and p.min_p == 1.0
    # The 64-bit extremes pass, and the messages that carry them encode.
    big = SamplingParams(top_k=2**63 - 1, seed=-(2**63), max_tokens=2**63 - 1,
                         stop_token_ids=[2**63 - 1], logprobs=2**63 - 1)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(big.to_options()),
                                  type=SamplingOptions) == big.to_options()


def test_normalisation():
    p = SamplingParams(top_k=-1, stop_token_ids=[3, 4])
    assert p.top_k == 0
    assert p.stop_token_ids == (3, 4)
    assert p == SamplingParams(top_k=0, stop_token_ids=(3, 4))


def test_assigned_fields_are_checked_in_the_copy_an_entry_point_takes():
    """vLLM's scripts assign fields (``params.max_tokens = 64``): ``checked``
    normalizes them as the constructor does and refuses a broken one; the
    copy does not follow later assignments to the original."""
    p = SamplingParams()
    p.max_tokens, p.top_k, p.stop, p.seed = 64, -1, "###", -1
    p.logit_bias = {3: 1.5}
    q = p.checked()
    assert (q.max_tokens, q.top_k, q.stop, q.seed) == (64, 0, ("###",), None)
    p.logit_bias[3] = -100.0
    p.max_tokens = 2
    assert q.logit_bias == {3: 1.5} and q.max_tokens == 64
    p.temperature = -1.0
    with pytest.raises(ValueError, match="temperature"):
        p.checked()
    p.temperature, p.min_tokens = 1.0, 5
    with pytest.raises(ValueError, match=r"min_tokens must be an int in \[0, max_tokens=2\]"):
        p.checked()


def test_stop_and_max_tokens_none():
    assert SamplingParams(stop="###").stop == ("###",)
    assert SamplingParams(stop=["a", "bc"]).stop == ("a", "bc")
    p = SamplingParams(max_tokens=None, min_tokens=5)
    assert p.max_tokens is None
    assert p.replaced(max_tokens=7).max_tokens == 7
    with pytest.raises(ValueError, match=r"min_tokens must be an int in \[0, max_tokens=3\]"):
        p.replaced(max_tokens=3)


def test_vllm_spellings_of_none():
    """vLLM's: stop and stop_token_ids None are none; seed -1 is no seed,
    and a choice whose seed + index lands on -1 takes the range's minimum
    instead (it stays seeded, apart from its siblings)."""
    p = SamplingParams(stop=None, stop_token_ids=None, seed=-1)
    assert (p.stop, p.stop_token_ids, p.seed) == ((), (), None)
    assert p == SamplingParams()
    assert [c.seed for c in SamplingParams(n=3, seed=-3).choices()] == [-3, -2, -(2**63)]


def test_choices_seed_plus_index_wrapped():
    """Choice i of n samples with seed + i in the signed 64-bit range; every
    other field is the parent's, with n 1."""
    top = 2**63 - 1
    choices = SamplingParams(n=3, seed=top - 1, temperature=0.5, stop="x").choices()
    assert [c.seed for c in choices] == [top - 1, top, -(2**63)]
    assert all(c.n == 1 and c.temperature == 0.5 and c.stop == ("x",) for c in choices)
    assert [c.seed for c in SamplingParams(n=2).choices()] == [None, None]
    one = SamplingParams(seed=3)
    assert one.choices() == [one] and one.choices()[0] is one


def test_unknown_keyword():
    with pytest.raises(TypeError):
        SamplingParams(temprature=0.0)
    with pytest.raises(ValueError, match="unknown sampling parameter.*best_of, temprature"):
        SamplingParams.from_dict({"temprature": 0.0, "best_of": 2, "max_tokens": 3})
    assert SamplingParams.from_dict({"max_tokens": 3, "top_k": -1}) == SamplingParams(max_tokens=3)


def test_keys_that_are_not_text_are_unknown_fields():
    """An engine message may carry a mapping with keys of any type (msgpack
    allows them): they are unknown fields, the client's error, at both
    levels."""
    with pytest.raises(InvalidRequestError, match=r"unknown sampling parameter\(s\): 7, b'x'"):
        SamplingParams.from_dict({7: 1, b"x": 2, "max_tokens": 3})
    with pytest.raises(InvalidRequestError, match=r"unknown structured_outputs field\(s\): 1;"):
        SamplingParams.from_dict({"structured_outputs": {1: "x", "regex": "a"}})


def test_to_options_round_trips_through_msgspec():
    p = SamplingParams(
        temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, seed=7, logprobs=2,
        repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=-0.5,
    )  # fmt: skip
    opts = p.to_options()
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(opts), type=SamplingOptions)
    assert decoded == opts
    for f in msgspec.structs.fields(SamplingOptions):
        assert getattr(opts, f.name) == getattr(p, f.name), f.name
    assert SamplingParams().to_options() == SamplingOptions()


def test_at_most_max_stop_strings():
    stops = [f"s{i}" for i in range(MAX_STOP_STRINGS)]
    assert len(SamplingParams(stop=stops).stop) == MAX_STOP_STRINGS
    with pytest.raises(ValueError, match=f"stop holds 1025 strings, more than {MAX_STOP_STRINGS}"):
        SamplingParams(stop=[*stops, "one more"])


def test_output_kind_is_vllms_enum_and_crosses_the_wire_as_its_value():
    """vLLM's values (CUMULATIVE 0, DELTA 1, FINAL_ONLY 2), CUMULATIVE by
    default; a value is taken as its member (what a message carries back)."""
    assert [(k.name, k.value) for k in RequestOutputKind] == [
        ("CUMULATIVE", 0), ("DELTA", 1), ("FINAL_ONLY", 2)]
    assert SamplingParams().output_kind is RequestOutputKind.CUMULATIVE
    params = SamplingParams(output_kind=RequestOutputKind.DELTA)
    assert params.to_dict()["output_kind"] == 1
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(params.to_dict()))
    assert SamplingParams.from_dict(wire).output_kind is RequestOutputKind.DELTA
    assert SamplingParams(output_kind=2).output_kind is RequestOutputKind.FINAL_ONLY
    params.output_kind = 5
    with pytest.raises(InvalidRequestError, match="output_kind") as caught:
        params.checked()
    assert caught.value.param == "output_kind"
