"""Yak's metrics (the catalogue: :mod:`yak_pipeline.core.metric_catalogue`) kept in PostgreSQL, so
every process's work counts.

Writers append to ``metric_events``: triggers in ``sql/003_api.sql`` do it for distillations
created and versioned, memories forgotten, conflicts, warmth updates and failed attempts; the
API appends its request counts and recall latencies; pipeline runs append their distillation
latencies with :func:`record_distillation_latency`. :func:`read_metrics`, called at scrape
time, folds the appended rows into the totals and returns them.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

import psycopg
from psycopg.types.json import Jsonb

from yak_pipeline.core.metric_catalogue import METRICS_BY_NAME, MetricDefinition, MetricKind

# Serialises concurrent folds (two scrapes at once) so each event is added exactly once.
_FOLD_LOCK_KEY: Final = 0x59414B_4D54  # "YAK" "MT"

Labels = Mapping[str, str]
# A label set as a sorted tuple of pairs: hashable, one form for the same labels in any order.
LabelsKey = tuple[tuple[str, str], ...]


def _labels_key(labels: Labels | None) -> LabelsKey:
    return tuple(sorted((str(k), str(v)) for k, v in (labels or {}).items()))


def _definition(name: str, kind: MetricKind) -> MetricDefinition:
    definition = METRICS_BY_NAME.get(name)
    if definition is None or definition.kind != kind:
        raise ValueError(f"{name!r} is not one of Yak's {kind} metrics")
    return definition


def _finite_non_negative(value: float) -> float:
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"a metric value must be a finite number >= 0, got {value!r}")
    return number


@dataclass(frozen=True)
class MetricEvent:
    """One counter increment or histogram sample, waiting to be folded into the totals."""

    kind: Literal["counter", "observation"]
    name: str
    value: float
    labels: LabelsKey = ()


def counter_event(name: str, amount: float = 1.0, labels: Labels | None = None) -> MetricEvent:
    """An increment of counter ``name`` (one of the catalogue's :data:`~yak_pipeline.core.metric_catalogue.METRICS`)."""
    _definition(name, "counter")
    return MetricEvent("counter", name, _finite_non_negative(amount), _labels_key(labels))


def observation_event(name: str, value: float, labels: Labels | None = None) -> MetricEvent:
    """A sample of histogram ``name`` (one of the catalogue's :data:`~yak_pipeline.core.metric_catalogue.METRICS`)."""
    _definition(name, "histogram")
    return MetricEvent("observation", name, _finite_non_negative(value), _labels_key(labels))


def append_metric_events(conn: psycopg.Connection, events: Iterable[MetricEvent]) -> int:
    """Append events in the caller's transaction (they count only if it commits); returns how many."""
    rows = [{"kind": e.kind, "name": e.name, "labels": Jsonb(dict(e.labels)), "value": e.value} for e in events]
    if rows:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO metric_events (kind, name, labels, value) "
                            "VALUES (%(kind)s, %(name)s, %(labels)s, %(value)s)", rows)
    return len(rows)


def record_distillation_latency(conn: psycopg.Connection, milliseconds: float) -> None:
    """Record how long distilling one exchange took; call it in the transaction that stores it."""
    append_metric_events(conn, [observation_event("yak_distillation_latency_ms", milliseconds)])


def record_error(conn: psycopg.Connection, error_type: str, count: int = 1) -> None:
    """Count an error of ``error_type`` that no table records by itself.

    Failed distillation and warmth attempts are already counted by triggers (they raise
    ``attempts`` and set ``last_error``); use this for the others.
    """
    append_metric_events(conn, [counter_event("yak_errors_total", count, {"type": error_type})])


def fold_metric_events(conn: psycopg.Connection) -> int:
    """Move appended events into the totals, in the caller's transaction; returns how many.

    Rows of transactions still in flight are invisible here and folded by a later scrape.
    """
    conn.execute("SELECT pg_advisory_xact_lock(%(key)s)", {"key": _FOLD_LOCK_KEY})
    rows = conn.execute("DELETE FROM metric_events RETURNING kind, name, labels, value").fetchall()
    counters: dict[tuple[str, LabelsKey], float] = {}
    buckets: dict[tuple[str, LabelsKey, float], int] = {}
    for kind, name, labels, value in rows:
        key = _labels_key(labels)
        if kind == "counter":
            counters[(name, key)] = counters.get((name, key), 0.0) + value
            continue
        definition = METRICS_BY_NAME.get(name)
        bounds = definition.buckets if definition is not None else ()
        index = bisect.bisect_left(bounds, value)
        le = bounds[index] if index < len(bounds) else math.inf
        buckets[(name, key, le)] = buckets.get((name, key, le), 0) + 1
        counters[(f"{name}_sum", key)] = counters.get((f"{name}_sum", key), 0.0) + value
    # Sorted, so concurrent writers of the totals always lock rows in one order.
    for (name, key), value in sorted(counters.items()):
        conn.execute(
            """INSERT INTO metric_counters (name, labels, value) VALUES (%(name)s, %(labels)s, %(value)s)
               ON CONFLICT (name, labels) DO UPDATE SET value = metric_counters.value + EXCLUDED.value""",
            {"name": name, "labels": Jsonb(dict(key)), "value": value},
        )
    for (name, key, le), count in sorted(buckets.items()):
        conn.execute(
            """INSERT INTO metric_histogram_buckets (name, labels, le, count)
               VALUES (%(name)s, %(labels)s, %(le)s, %(count)s)
               ON CONFLICT (name, labels, le) DO UPDATE SET count = metric_histogram_buckets.count + EXCLUDED.count""",
            {"name": name, "labels": Jsonb(dict(key)), "le": le, "count": count},
        )
    return len(rows)


@dataclass(frozen=True)
class HistogramTotals:
    """One labelled histogram series: cumulative counts per bound (the last is +Inf), and the sum."""

    buckets: tuple[tuple[float, int], ...]
    sum: float

    @property
    def count(self) -> int:
        """Number of samples."""
        return self.buckets[-1][1] if self.buckets else 0


@dataclass
class MetricTotals:
    """Every metric's value at one scrape."""

    counters: dict[str, dict[LabelsKey, float]] = field(default_factory=dict)
    histograms: dict[str, dict[LabelsKey, HistogramTotals]] = field(default_factory=dict)
    queue_sizes: dict[str, int] = field(default_factory=dict)


def _histograms(rows: list[tuple[str, Labels, float, int]],
                sums: dict[tuple[str, LabelsKey], float]) -> dict[str, dict[LabelsKey, HistogramTotals]]:
    per_series: dict[tuple[str, LabelsKey], dict[float, int]] = {}
    for name, labels, le, count in rows:
        per_series.setdefault((name, _labels_key(labels)), {})[float(le)] = int(count)
    result: dict[str, dict[LabelsKey, HistogramTotals]] = {}
    for (name, key), stored in per_series.items():
        definition = METRICS_BY_NAME.get(name)
        if definition is None:
            continue
        bounds = (*definition.buckets, math.inf)
        cumulative, running = [], 0
        # Stored bounds that are not current bounds (after a bucket change) count in the next one up.
        for bound in bounds:
            running = sum(count for le, count in stored.items() if le <= bound)
            cumulative.append((bound, running))
        result.setdefault(name, {})[key] = HistogramTotals(tuple(cumulative), sums.get((name, key), 0.0))
    return result


def read_metrics(conn: psycopg.Connection, *, queue_sizes: Mapping[str, int]) -> MetricTotals:
    """Fold pending events, then every counter and histogram total, plus the given queue sizes."""
    fold_metric_events(conn)
    counter_rows = conn.execute("SELECT name, labels, value FROM metric_counters").fetchall()
    bucket_rows = conn.execute("SELECT name, labels, le, count FROM metric_histogram_buckets").fetchall()
    totals = MetricTotals(queue_sizes=dict(queue_sizes))
    sums: dict[tuple[str, LabelsKey], float] = {}
    for name, labels, value in counter_rows:
        if name.endswith("_sum") and name.removesuffix("_sum") in METRICS_BY_NAME:
            sums[(name.removesuffix("_sum"), _labels_key(labels))] = float(value)
        elif name in METRICS_BY_NAME:
            totals.counters.setdefault(name, {})[_labels_key(labels)] = float(value)
    totals.histograms = _histograms(bucket_rows, sums)
    return totals
