"""``LLM.get_metrics()``: vLLM's records (``engine.metrics_reader``) of
what the ``LLM`` did. After N generate requests the token counters are the
prompts' token counts (by the tokenizer) and the outputs' token counts; the
latency histograms counted each request once (time to first token,
end-to-end) or once a token after its first (inter-token); the success
counters, one a finished reason, count the outputs by their
finish_reason; the accepted-draft counters by position read as one
``Vector``. Without ``disable_log_stats=False`` the call is vLLM's error."""

from __future__ import annotations

import msgspec
import pytest

from engine import LLM, SamplingParams
from engine.metrics_reader import Counter, Gauge, Histogram, Metric, Vector
from engine.prometheus_metrics import Metrics
from ipc.engine_messages import EngineStats

PROMPTS = ["hello there", "abc", "a longer prompt of several words"]


def _one(records: list[Metric], name: str, kind: type, **labels) -> Metric:
    found = [r for r in records if r.name == name and isinstance(r, kind)
             and all(r.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_disabled_stats_are_vllms_error():
    with LLM("tiny", device="cpu") as llm:  # disable_log_stats is True by default
        with pytest.raises(AssertionError, match="Stat logging disabled"):
            llm.get_metrics()


@pytest.mark.timeout(300)
def test_counters_and_histograms_after_n_requests():
    with LLM("tiny", device="cpu", disable_log_stats=False) as llm:
        tokenizer = llm.get_tokenizer()
        greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
        first = llm.generate(PROMPTS[0], greedy)[0].outputs[0].token_ids
        # The first prompt again stops at its third token ("stop"), the others
        # run to max_tokens ("length").
        params = [SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True,
                                 stop_token_ids=[first[2]]),
                  greedy, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)]
        outs = [*llm.generate(PROMPTS, params)]
        records = llm.get_metrics()

    expected_reasons = {"stop": 0, "length": 1}  # the first call's request: length
    for out in outs:
        expected_reasons[out.outputs[0].finish_reason] += 1
    assert expected_reasons == {"stop": 1, "length": 3}
    num_requests = 1 + len(PROMPTS)
    prompt_tokens = len(tokenizer.encode(PROMPTS[0])) + sum(
        len(tokenizer.encode(p)) for p in PROMPTS)
    generated = [len(first), *(len(o.outputs[0].token_ids) for o in outs)]
    assert generated == [6, 3, 6, 4]

    assert _one(records, "tprun:prompt_tokens", Counter).value == prompt_tokens
    assert _one(records, "tprun:generation_tokens", Counter).value == sum(generated)
    for reason in ("stop", "length", "abort"):
        success = _one(records, "tprun:request_success", Counter, finished_reason=reason)
        assert success.value == expected_reasons.get(reason, 0), reason
    assert _one(records, "tprun:num_requests_running", Gauge).value == 0
    assert _one(records, "tprun:num_requests_waiting", Gauge).value == 0

    ttft = _one(records, "tprun:time_to_first_token_seconds", Histogram)
    e2e = _one(records, "tprun:e2e_request_latency_seconds", Histogram)
    itl = _one(records, "tprun:inter_token_latency_seconds", Histogram)
    assert ttft.count == e2e.count == num_requests
    assert itl.count == sum(n - 1 for n in generated)  # one token a step: a gap each after the first
    for histogram in (ttft, e2e, itl):
        assert histogram.buckets["+Inf"] == histogram.count
        assert histogram.sum > 0
        bounds = [b for b in histogram.buckets if b != "+Inf"]
        counts = [histogram.buckets[b] for b in bounds]
        assert counts == sorted(counts) and counts[-1] <= histogram.count  # cumulative
    assert ttft.labels == {"model_name": "tiny"}


@pytest.mark.timeout(300)
def test_interrupted_requests_count_as_aborted(monkeypatch):
    """A generate call interrupted mid-way (its third step raises) aborts
    its requests; each counts once, as "abort"."""
    with LLM("tiny", device="cpu", disable_log_stats=False) as llm:
        engine, real_step, steps = llm.engine, llm.engine.step, []

        def interrupted_step():
            steps.append(1)
            deltas = real_step()
            if len(steps) == 3:
                raise KeyboardInterrupt
            return deltas

        monkeypatch.setattr(engine, "step", interrupted_step)
        with pytest.raises(KeyboardInterrupt):
            llm.generate(PROMPTS[:2], SamplingParams(max_tokens=50, ignore_eos=True))
        records = llm.get_metrics()
    assert _one(records, "tprun:request_success", Counter, finished_reason="abort").value == 2
    assert _one(records, "tprun:e2e_request_latency_seconds", Histogram).count == 2
    assert _one(records, "tprun:time_to_first_token_seconds", Histogram).count == 2


def test_reader_by_hand():
    """Known values in, vLLM's records out: the accepted drafts by position
    as one Vector, a histogram's cumulative buckets around its observations."""
    stats = EngineStats(num_running=2, num_waiting=1, num_blocks=10, num_free_blocks=5,
                        kv_usage=0.5, prefix_hit_rate=0.0, num_preemptions=3, num_steps=10,
                        num_prompt_tokens=100, num_generation_tokens=50,
                        num_scheduled_tokens=150, spec_decode_num_drafts=4,
                        spec_decode_num_draft_tokens=12, spec_decode_num_accepted_tokens=17,
                        spec_decode_num_accepted_tokens_per_pos=[9, 5, 3])
    metrics = Metrics("m")
    metrics.finished("stop", 0.4)
    metrics.finished("stop", 0.9)
    metrics.finished("length", 3.0)
    records = metrics.snapshot(stats)
    vector = _one(records, "tprun:spec_decode_num_accepted_tokens_per_pos", Vector)
    assert vector.values == [9, 5, 3] and vector.labels == {"model_name": "m"}
    assert _one(records, "tprun:num_preemptions", Counter).value == 3
    assert _one(records, "tprun:num_requests_waiting", Gauge).value == 1
    assert _one(records, "tprun:kv_cache_usage_perc", Gauge).value == 0.5
    e2e = _one(records, "tprun:e2e_request_latency_seconds", Histogram)
    assert (e2e.count, e2e.sum) == (3, pytest.approx(4.3))
    assert [e2e.buckets[b] for b in ("0.3", "0.5", "0.8", "1.0", "2.5", "5.0", "+Inf")] == [
        0, 1, 1, 2, 2, 3, 3]
    assert _one(records, "tprun:request_success", Counter, finished_reason="stop").value == 2
    off = msgspec.structs.replace(stats, spec_decode_num_accepted_tokens_per_pos=[])
    assert not [r for r in metrics.snapshot(off) if isinstance(r, Vector)]


@pytest.mark.timeout(300)
def test_spec_decode_vector_adds_up_to_the_accepted_counter():
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
            "prompt_lookup_min": 1}
    with LLM("tiny", device="cpu", disable_log_stats=False, speculative_config=spec) as llm:
        outs = llm.generate(["ab ab ab ab ab ab ab ab", "xyz xyz xyz xyz"],
                            SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True))
        records = llm.get_metrics()
    vector = _one(records, "tprun:spec_decode_num_accepted_tokens_per_pos", Vector)
    accepted = _one(records, "tprun:spec_decode_num_accepted_tokens", Counter).value
    assert len(vector.values) == 3
    assert accepted > 0  # else the sums below would hold for any all-zero Vector
    assert sum(vector.values) == accepted
    assert vector.values == sorted(vector.values, reverse=True)  # a later position needs the earlier
    assert _one(records, "tprun:generation_tokens", Counter).value == sum(
        len(o.outputs[0].token_ids) for o in outs)
