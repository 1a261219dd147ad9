"""The Prometheus metrics of one front end, with vLLM's metric names under
the ``tprun:`` prefix: the HTTP server's page (``GET /metrics``) and an
in-process ``LLM``'s ``get_metrics()`` (``metrics_reader``) are both read
from a ``Metrics`` registry, recorded by the same calls
(``observe_tokens``, ``finished``).

Engine-side values (running and waiting requests, KV-cache usage, prompt
and generation token counters, preemptions, prefix-cache lookups and hits
in tokens) come from one ``EngineStats`` snapshot asked for at scrape time,
so they are the engine's own numbers, not the front end's guess; with
data-parallel replicas, one snapshot of each, under vLLM's ``engine``
label. What the
client sees is measured here (the HTTP server's ``Generation`` or the
``LLM`` call, with each engine request's
``engine.request_metrics.RequestTimes``): time to first token from the
request's submission, inter-token latency between consecutive deltas of one
engine request (divided among the tokens a delta carries), each engine
request's end-to-end latency (submission to its end) and how it finished
(``request_success``, by ``finished_reason``: stop, length or abort). Each
front end has its own registry.

With LoRA on, vLLM's ``lora_requests_info`` gauge says which adapters the
engine's requests run with, in its labels: ``max_lora`` (``max_loras``),
``running_lora_adapters`` and ``waiting_lora_adapters`` (the names of the
adapters of the running requests, and of the waiting ones, counted from
their arrival as ``num_waiting`` counts them; comma-separated, each once,
in the order of the requests; empty: none). As in vLLM its value is the
Unix time those stats were taken (a scrape's, as the snapshot is), so the
latest sample is the one of highest value; a scrape shows one sample, the
engine's state as the snapshot found it.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from engine.metrics_reader import Metric, read_metrics
from engine.request_metrics import RequestTimes
from ipc.engine_messages import EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1,
                0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)


class _EngineCollector:
    """Yields the gauges and counters of the snapshots set before a scrape:
    one engine's under the ``model_name`` label; several (data-parallel
    replicas) each under ``model_name`` and ``engine`` (its index), as
    vLLM labels its engines. ``max_loras``: the engine's adapter slots (0:
    LoRA off, no ``lora_requests_info``); ``taken_at``: the Unix time the
    snapshots came."""

    def __init__(self, model_name: str, max_loras: int = 0) -> None:
        self.model_name = model_name
        self.max_loras = max_loras
        self.stats: list[EngineStats] = []
        self.taken_at = 0.0

    def _labels(self) -> tuple[list[str], list[list[str]]]:
        """The label names, and each snapshot's label values."""
        if len(self.stats) == 1:
            return ["model_name"], [[self.model_name]]
        return (["model_name", "engine"],
                [[self.model_name, str(index)] for index in range(len(self.stats))])

    def collect(self):
        if not self.stats:
            return
        label, values = self._labels()
        for name, doc, field in (
            ("tprun:num_requests_running", "Requests in the running batch.", "num_running"),
            ("tprun:num_requests_waiting",
             "Requests waiting to be scheduled (from their arrival, admission included).",
             "num_waiting"),
            ("tprun:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1).",
             "kv_usage"),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=label)
            for row, s in zip(values, self.stats):
                gauge.add_metric(row, getattr(s, field))
            yield gauge
        yield from self._counters(label, values, (
            ("tprun:prompt_tokens", "Prompt tokens scheduled since start.", "num_prompt_tokens"),
            ("tprun:generation_tokens", "Tokens generated since start.",
             "num_generation_tokens"),
            ("tprun:num_preemptions", "Requests preempted since start.", "num_preemptions"),
            ("tprun:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
             "prefix_cache_queries"),
            ("tprun:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
             "prefix_cache_hits"),
        ))
        if self.stats[0].spec_decode_num_accepted_tokens_per_pos:  # speculative decoding is on
            yield from self._spec_decode(label, values)
        if self.max_loras:
            yield self._lora_info()

    def _lora_info(self) -> GaugeMetricFamily:
        """vLLM's ``lora_requests_info`` (module docstring); with several
        engines, one sample each under ``engine``."""
        several = len(self.stats) > 1
        gauge = GaugeMetricFamily(
            "tprun:lora_requests_info", "LoRA adapters of the running and waiting requests "
            "(labels); the value is the Unix time of these stats.",
            labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters",
                    *(["engine"] if several else [])])
        for index, s in enumerate(self.stats):
            gauge.add_metric([str(self.max_loras), ",".join(s.waiting_lora_adapters),
                              ",".join(s.running_lora_adapters),
                              *([str(index)] if several else [])], self.taken_at)
        return gauge

    def _counters(self, label: list[str], values: list[list[str]], rows):
        for name, doc, field in rows:
            counter = CounterMetricFamily(name, doc, labels=label)
            for row, s in zip(values, self.stats):
                counter.add_metric(row, getattr(s, field))
            yield counter

    def _spec_decode(self, label: list[str], values: list[list[str]]):
        yield from self._counters(label, values, (
            ("tprun:spec_decode_num_drafts", "Steps of a request that verified drafts.",
             "spec_decode_num_drafts"),
            ("tprun:spec_decode_num_draft_tokens", "Draft tokens verified.",
             "spec_decode_num_draft_tokens"),
            ("tprun:spec_decode_num_accepted_tokens", "Draft tokens accepted.",
             "spec_decode_num_accepted_tokens"),
        ))
        per_pos = CounterMetricFamily("tprun:spec_decode_num_accepted_tokens_per_pos",
                                      "Draft tokens accepted, by position in the draft.",
                                      labels=[*label, "position"])
        for row, s in zip(values, self.stats):
            for position, value in enumerate(s.spec_decode_num_accepted_tokens_per_pos):
                per_pos.add_metric([*row, str(position)], value)
        yield per_pos


class Metrics:
    """The front end's registry; ``max_loras`` as ``_EngineCollector`` takes it."""

    def __init__(self, model_name: str, max_loras: int = 0) -> None:
        self.registry = CollectorRegistry()
        self.engine = _EngineCollector(model_name, max_loras)
        self.registry.register(self.engine)
        self.ttft = Histogram("tprun:time_to_first_token_seconds",
                              "Time from a request's arrival to its first token.",
                              ["model_name"], buckets=_TTFT_BUCKETS,
                              registry=self.registry).labels(model_name)
        self.itl = Histogram("tprun:inter_token_latency_seconds",
                             "Time between consecutive tokens of one request.",
                             ["model_name"], buckets=_ITL_BUCKETS,
                             registry=self.registry).labels(model_name)
        self.e2e = Histogram("tprun:e2e_request_latency_seconds",
                             "Time from a request's arrival to its last token.",
                             ["model_name"], buckets=_E2E_BUCKETS,
                             registry=self.registry).labels(model_name)
        success = Counter("tprun:request_success", "Engine requests finished, by how.",
                          ["model_name", "finished_reason"], registry=self.registry)
        self._success = {reason: success.labels(model_name, reason)  # each shown from 0
                         for reason in FINISHED_REASONS}

    def finished(self, reason: str, latency_s: float) -> None:
        """One engine request ended, for ``reason`` (one of FINISHED_REASONS)."""
        self._success[reason].inc()
        self.e2e.observe(latency_s)

    def observe_tokens(self, times: RequestTimes, num_tokens: int, now: float) -> None:
        """``num_tokens`` (> 0) of the engine request of ``times`` came at
        ``now`` (monotonic): its time to first token, or the gap since its
        last tokens shared among these (``RequestTimes.tokens_at``, which
        this call makes)."""
        gap = times.tokens_at(now)
        if gap is None:
            self.ttft.observe(times.first_token_latency)
        else:
            for _ in range(num_tokens):
                self.itl.observe(gap / num_tokens)

    def render(self, stats: EngineStats | list[EngineStats]) -> bytes:
        """The page, with ``stats`` as the engine's values (a list: one
        per data-parallel replica, in replica order)."""
        self._set_stats(stats)
        return generate_latest(self.registry)

    def snapshot(self, stats: EngineStats | list[EngineStats]) -> list[Metric]:
        """Every metric as ``metrics_reader``'s records, with ``stats`` as
        ``render`` takes them."""
        self._set_stats(stats)
        return read_metrics(self.registry)

    def _set_stats(self, stats: EngineStats | list[EngineStats]) -> None:
        self.engine.stats = [stats] if isinstance(stats, EngineStats) else list(stats)
        self.engine.taken_at = time.time()
