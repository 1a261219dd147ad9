"""``LLM.get_metrics()``'s records: vLLM's ``Metric``, ``Counter``,
``Gauge``, ``Histogram`` and ``Vector`` (its ``vllm.v1.metrics.reader``
names and fields), read from a Prometheus registry.

``read_metrics`` turns each metric family of the registry whose name starts
with ``tprun:`` into records, one per label set: a gauge into a ``Gauge``,
a counter into a ``Counter`` (its ``_total`` sample, as an int), a
histogram into a ``Histogram`` (buckets by their ``le`` bound, as the text
page writes it, "+Inf" among them; ``count`` and ``sum``), and the one
counter labelled by draft position, ``tprun:spec_decode_num_accepted_tokens_per_pos``,
into a ``Vector`` per label set without ``position`` (its values by
position, 0 for a position without a sample). A family of another type
(summary, info, ...) gives no record, as vLLM's reader skips it. Names are
the family's, as ``/metrics`` names them (``tprun:prompt_tokens``, not
``..._total``).
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry

PREFIX = "tprun:"
VECTOR_BY_POSITION = "tprun:spec_decode_num_accepted_tokens_per_pos"


@dataclass
class Metric:
    """One metric under one set of ``labels`` (``key=value``); a metric
    name may come several times, once per label set."""

    name: str
    labels: dict[str, str]


@dataclass
class Counter(Metric):
    """A count that only grows."""

    value: int


@dataclass
class Vector(Metric):
    """Counts by position (``values[i]``: position i's), the Prometheus
    counters of one label set that differ only in their ``position``."""

    values: list[int]


@dataclass
class Gauge(Metric):
    """A value that goes up and down."""

    value: float


@dataclass
class Histogram(Metric):
    """Observations by bucket: ``buckets`` maps each bucket's upper bound
    (its ``le`` label, "+Inf" included) to the observations at or below
    it, cumulative as Prometheus keeps them; ``count`` is every
    observation (the "+Inf" bucket's), ``sum`` their total."""

    count: int
    sum: float
    buckets: dict[str, int]


def read_metrics(registry: CollectorRegistry) -> list[Metric]:
    """Every ``tprun:`` metric of ``registry`` now, as records (module
    docstring), in the registry's order."""
    records: list[Metric] = []
    for family in registry.collect():
        if not family.name.startswith(PREFIX):
            continue
        if family.type == "gauge":
            records += [
                Gauge(family.name, dict(s.labels), s.value)
                for s in family.samples
                if s.name == family.name
            ]
        elif family.type == "counter" and family.name == VECTOR_BY_POSITION:
            records += _vectors(family)
        elif family.type == "counter":
            records += [
                Counter(family.name, dict(s.labels), int(s.value))
                for s in family.samples
                if s.name == family.name + "_total"
            ]
        elif family.type == "histogram":
            records += _histograms(family)
    return records


def _key(labels: dict[str, str], without: str | None = None) -> tuple:
    return tuple(sorted((k, v) for k, v in labels.items() if k != without))


def _vectors(family) -> list[Vector]:
    by_labels: dict[tuple, dict[int, int]] = {}
    for s in family.samples:
        if s.name == family.name + "_total":
            positions = by_labels.setdefault(_key(s.labels, "position"), {})
            positions[int(s.labels["position"])] = int(s.value)
    return [
        Vector(family.name, dict(key), [positions.get(i, 0) for i in range(max(positions) + 1)])
        for key, positions in by_labels.items()
    ]


def _histograms(family) -> list[Histogram]:
    parts: dict[tuple, dict] = {}
    for s in family.samples:
        if s.name == family.name + "_bucket":
            part = parts.setdefault(_key(s.labels, "le"), {"buckets": {}})
            part["buckets"][s.labels["le"]] = int(s.value)
        elif s.name in (family.name + "_count", family.name + "_sum"):
            part = parts.setdefault(_key(s.labels), {"buckets": {}})
            part[s.name[len(family.name) + 1 :]] = s.value
    return [
        Histogram(family.name, dict(key), int(part["count"]), part["sum"], part["buckets"])
        for key, part in parts.items()
    ]
