"""The Prometheus page (``GET /metrics``), with vLLM's metric names under
the ``tprun:`` prefix.

Engine-side values (running and waiting requests, KV-cache usage, prompt
and generation token counters) come from one ``EngineStats`` snapshot asked
for at scrape time, so they are the engine's own numbers, not the front
end's guess. Latencies are measured here, where the client sees them:
time to first token from the HTTP request's arrival, and inter-token
latency between consecutive deltas of one engine request (divided among
the tokens a delta carries). Each front end has its own registry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ipc.engine_messages import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
                0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)


class _EngineCollector:
    """Yields the gauges and counters of the snapshot set before a scrape."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.stats: EngineStats | None = None

    def collect(self):
        s = self.stats
        if s is None:
            return
        label = ["model_name"]
        for name, doc, value in (
            ("tprun:num_requests_running", "Requests in the running batch.", s.num_running),
            ("tprun:num_requests_waiting", "Requests waiting to be scheduled.", s.num_waiting),
            ("tprun:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1).",
             s.kv_usage),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=label)
            gauge.add_metric([self.model_name], value)
            yield gauge
        for name, doc, value in (
            ("tprun:prompt_tokens", "Prompt tokens scheduled since start.", s.num_prompt_tokens),
            ("tprun:generation_tokens", "Tokens generated since start.",
             s.num_generation_tokens),
        ):
            counter = CounterMetricFamily(name, doc, labels=label)
            counter.add_metric([self.model_name], value)
            yield counter


class Metrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.engine = _EngineCollector(model_name)
        self.registry.register(self.engine)
        self.ttft = Histogram("tprun:time_to_first_token_seconds",
                              "Time from a request's arrival to its first token.",
                              ["model_name"], buckets=_TTFT_BUCKETS,
                              registry=self.registry).labels(model_name)
        self.itl = Histogram("tprun:inter_token_latency_seconds",
                             "Time between consecutive tokens of one request.",
                             ["model_name"], buckets=_ITL_BUCKETS,
                             registry=self.registry).labels(model_name)

    def render(self, stats: EngineStats) -> bytes:
        """The page, with ``stats`` as the engine's values."""
        self.engine.stats = stats
        return generate_latest(self.registry)
