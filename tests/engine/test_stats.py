"""Engine statistics: counters checked against what the steps must have
done, the log line's arithmetic, and the logger's interval."""

from __future__ import annotations

import logging

import pytest

from engine import LLM, SamplingParams
from engine.stats import StatsLogger, interval_line
from ipc.engine_messages import EngineStats


def stats(**kw) -> EngineStats:
    base = dict(num_running=0, num_waiting=0, num_blocks=100, num_free_blocks=100, kv_usage=0.0,
                prefix_hit_rate=0.0, num_preemptions=0, num_steps=0, num_prompt_tokens=0,
                num_generation_tokens=0, num_scheduled_tokens=0)
    base.update(kw)
    return EngineStats(**base)


def test_interval_line_arithmetic():
    prev = stats(num_prompt_tokens=100, num_generation_tokens=10, num_preemptions=1)
    now = stats(num_prompt_tokens=300, num_generation_tokens=60, num_preemptions=4,
                num_running=3, num_waiting=2, kv_usage=0.125, prefix_hit_rate=0.9)
    line = interval_line(prev, now, elapsed_s=4.0, prefix=(25, 100))
    assert line == (
        "Avg prompt throughput: 50.0 tokens/s, Avg generation throughput: 12.5 tokens/s, "
        "Running: 3 reqs, Waiting: 2 reqs, KV cache usage: 12.5%, "
        "Prefix cache hit rate: 25.0%, Preemptions: 3"
    )
    assert "Prefix cache hit rate: 90.0%" in interval_line(prev, now, 4.0)  # no lookups


def test_logger_waits_for_its_interval_and_skips_quiet_ones(caplog):
    clock = [0.0]
    current = [stats()]
    logger = StatsLogger(lambda _num_admitting: current[0], lambda: (0, 0), interval_s=5.0,
                         clock=lambda: clock[0])
    with caplog.at_level(logging.INFO, logger="tprun.stats"):
        current[0] = stats(num_generation_tokens=20, num_scheduled_tokens=20, num_running=1)
        clock[0] = 4.9
        assert logger.maybe_log() is None
        clock[0] = 5.0
        line = logger.maybe_log()
        assert "Avg generation throughput: 4.0 tokens/s" in line
        clock[0] = 10.0  # nothing ran, nothing queued: quiet
        current[0] = stats(num_generation_tokens=20, num_scheduled_tokens=20)
        assert logger.maybe_log() is None
    assert [r.getMessage() for r in caplog.records] == [line]
    with pytest.raises(ValueError, match="interval"):
        StatsLogger(lambda _num_admitting: current[0], lambda: (0, 0), interval_s=0)


@pytest.mark.timeout(60)
def test_counters_match_the_steps():
    prompts = [{"prompt_token_ids": [(5 * i + j) % 200 + 1 for j in range(10 + 7 * i)]}
               for i in range(5)]
    max_tokens = [3, 8, 5, 1, 6]
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in max_tokens]
    with LLM(model="tiny", device="cpu", enable_prefix_caching=False,
             max_num_batched_tokens=24) as llm:
        engine = llm.engine
        absorbed, usage = [0], []
        update = engine.scheduler.update_from_output

        def counted_update(plan, output):
            absorbed[0] += 1
            usage.append(engine.get_stats().kv_usage)
            return update(plan, output)

        engine.scheduler.update_from_output = counted_update
        outs = llm.generate(prompts, params)
        s = engine.get_stats()
    prompt_tokens = sum(len(p["prompt_token_ids"]) for p in prompts)
    assert sum(len(o.outputs[0].token_ids) for o in outs) == sum(max_tokens)
    assert s.num_prompt_tokens == prompt_tokens
    assert s.num_generation_tokens == sum(max_tokens)
    # Every prompt token is fed once, and every output token but the last.
    assert s.num_scheduled_tokens == prompt_tokens + sum(m - 1 for m in max_tokens)
    assert s.num_steps == absorbed[0] > 0
    assert max(usage) > 0 and s.kv_usage == 0.0 and s.num_free_blocks == s.num_blocks
    assert s.num_running == s.num_waiting == 0 and s.num_preemptions == 0


@pytest.mark.timeout(60)
def test_preemptions_and_prefix_hits_are_counted(caplog):
    with LLM(model="tiny", device="cpu", num_gpu_blocks_override=6, max_model_len=6 * 16, max_num_seqs=4,
             disable_log_stats=False, log_stats_interval_s=1e-6) as llm:
        engine = llm.engine
        schedule, preempted = engine.scheduler.schedule, []

        def watched_schedule():
            out = schedule()
            preempted.extend(out.preempted_req_ids)
            return out

        engine.scheduler.schedule = watched_schedule
        prompt = {"prompt_token_ids": list(range(1, 34))}  # 33 tokens: 2 full blocks of 16
        params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
        with caplog.at_level(logging.INFO, logger="tprun.stats"):
            llm.generate([prompt] * 3, params)
        s = engine.get_stats()
    assert preempted and s.num_preemptions == len(preempted)
    assert 0 < s.prefix_hit_rate < 1
    lines = [r.getMessage() for r in caplog.records if r.name == "tprun.stats"]
    assert lines and all(line.startswith("Avg prompt throughput") for line in lines)
    assert any("Preemptions: 0" not in line for line in lines)


@pytest.mark.timeout(60)
def test_prefix_hit_rate_is_hits_over_prompt_tokens():
    with LLM(model="tiny", device="cpu", max_num_seqs=1) as llm:
        prompt = {"prompt_token_ids": list(range(1, 34))}  # 33 tokens
        params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
        llm.generate([prompt, prompt], params)
        s = llm.engine.get_stats()
    # The second request finds the first's 2 full blocks (32 tokens) of 66 looked up.
    assert s.prefix_hit_rate == pytest.approx(32 / 66)
    assert s.num_prompt_tokens == 33 + 1
