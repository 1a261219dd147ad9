"""Speculative decoding metrics: the ``tprun:spec_decode_*`` counters on
/metrics, the stats line, and ``tprun bench``'s acceptance figures."""

from __future__ import annotations

import msgspec
import pytest

from engine.bench import BenchConfig, format_summary, run_bench
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.prometheus_metrics import Metrics
from engine.stats import interval_line, spec_decode_summary
from ipc.engine_messages import EngineStats

BASE = EngineStats(num_running=1, num_waiting=0, num_blocks=10, num_free_blocks=5,
                   kv_usage=0.5, prefix_hit_rate=0.0, num_preemptions=0, num_steps=10,
                   num_prompt_tokens=100, num_generation_tokens=50, num_scheduled_tokens=150,
                   spec_decode_num_drafts=4, spec_decode_num_draft_tokens=12,
                   spec_decode_num_accepted_tokens=5,
                   spec_decode_num_accepted_tokens_per_pos=[3, 1, 1])
# 10 more verifying steps, 30 drafts, 12 accepted: 6, 4, 2 by position.
LATER = msgspec.structs.replace(BASE, num_steps=20, spec_decode_num_drafts=14,
                            spec_decode_num_draft_tokens=42,
                            spec_decode_num_accepted_tokens=17,
                            spec_decode_num_accepted_tokens_per_pos=[9, 5, 3])


def test_interval_summary_by_hand():
    spec = spec_decode_summary(BASE, LATER)
    assert spec["num_draft_tokens"] == 30 and spec["num_accepted_tokens"] == 12
    assert spec["acceptance_rate"] == pytest.approx(0.4)
    assert spec["mean_acceptance_length"] == pytest.approx(2.2)
    assert spec["acceptance_rate_per_position"] == pytest.approx([0.6, 0.4, 0.2])
    line = interval_line(BASE, LATER, 1.0)
    assert ("SpecDecoding metrics: Mean acceptance length: 2.20, Accepted: 12 tokens, "
            "Drafted: 30 tokens, Avg draft acceptance rate: 40.0%, Per-position acceptance "
            "rate: 0.60, 0.40, 0.20") in line
    assert spec_decode_summary(BASE, BASE) is None
    assert "SpecDecoding" not in interval_line(BASE, BASE, 1.0)


def test_metrics_page_has_the_spec_decode_counters():
    page = Metrics("m").render(LATER).decode()
    for line in ('tprun:spec_decode_num_drafts_total{model_name="m"} 14.0',
                 'tprun:spec_decode_num_draft_tokens_total{model_name="m"} 42.0',
                 'tprun:spec_decode_num_accepted_tokens_total{model_name="m"} 17.0',
                 'tprun:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",'
                 'position="0"} 9.0',
                 'tprun:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",'
                 'position="2"} 3.0'):
        assert line in page
    off = msgspec.structs.replace(BASE, spec_decode_num_accepted_tokens_per_pos=[])
    assert "spec_decode" not in Metrics("m").render(off).decode()


@pytest.mark.timeout(300)
def test_bench_reports_acceptance():
    engine = LLMEngine(EngineConfig(model="tiny", speculative_config={
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
        "prompt_lookup_min": 1}))
    try:
        summary = run_bench(engine, BenchConfig(num_prompts=4, input_len=16, output_len=48),
                            progress=False)
        stats = engine.scheduler.spec_stats
    finally:
        engine.shutdown()
    spec = summary["spec_decode"]
    assert spec["num_accepted_tokens"] > 0
    assert spec["num_draft_tokens"] <= stats.num_draft_tokens  # the warm-up is not counted
    assert spec["acceptance_rate"] == pytest.approx(
        spec["num_accepted_tokens"] / spec["num_draft_tokens"])
    assert "spec decode: acceptance rate" in format_summary(summary)
