"""``GET /metrics``: the metrics of :mod:`yak_pipeline.core.metric_catalogue`, read from PostgreSQL at scrape time.

Counts come from every process (see :mod:`yak_pipeline.services.metrics`). The API's own
contributions — request counts, recall latencies, errors it answered — are buffered in memory
and appended to the database every couple of seconds, before every scrape and at shutdown, so
counting never adds a database write to a request; a buffer that cannot be written (database
down) is kept and written later.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Final

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from yak_pipeline.core.metric_catalogue import METRICS, MetricDefinition
from yak_pipeline.services.metrics import (
    MetricEvent,
    MetricTotals,
    append_events,
    counter_event,
    observation_event,
)
from yak_pipeline.store.database import Database

FLUSH_INTERVAL_SECONDS: Final = 2.0


class MetricsBuffer:
    """This process's not-yet-written metric events (thread-safe)."""

    def __init__(self, *, observe_latency: bool = True) -> None:
        # False for an app that serves no one (the in-process CLI): its first recall loads the
        # embedding model in a fresh process, seconds that say nothing about served recall.
        self._observe_latency = observe_latency
        self._lock = threading.Lock()
        # Held from taking the events until they are written: a scrape's flush waits for one in
        # flight (the request middleware's), so it never reads the database between the two and
        # misses events that were counted before it (the proxy test's missing sample).
        self._flushing = threading.Lock()
        self._counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._observations: list[MetricEvent] = []
        self._last_flush = time.monotonic()

    def _add(self, event: MetricEvent) -> None:
        with self._lock:
            if event.kind == "counter":
                key = (event.name, event.labels)
                self._counters[key] = self._counters.get(key, 0.0) + event.value
            else:
                self._observations.append(event)

    def count_request(self, method: str, route: str, status_code: int) -> None:
        """Count one answered request."""
        self._add(counter_event("yak_requests_total", 1, {"method": method, "route": route,
                                                          "status": str(status_code)}))

    def observe_recall(self, milliseconds: float) -> None:
        """Record one recall's latency (not for an app that serves no one, see ``__init__``)."""
        if not self._observe_latency:
            return
        self._add(observation_event("yak_recall_latency_ms", milliseconds))

    def count_error(self, error_type: str) -> None:
        """Count one error the API ran into."""
        self._add(counter_event("yak_errors_total", 1, {"type": error_type}))

    def count_proxy_request(self, outcome: str, *, stream: bool) -> None:
        """Count one chat completion through the memory proxy by how it ended."""
        self._add(counter_event("yak_proxy_requests_total", 1, {"outcome": outcome, "stream": str(stream).lower()}))

    def count_injected_memories(self, count: int) -> None:
        """Count the memories one proxied prompt's block held."""
        if count:
            self._add(counter_event("yak_proxy_memories_injected", count))

    def count_proxy_degradation(self, reason: str) -> None:
        """Count a proxy request that lost part of the loop (one of ``KNOWN_DEGRADATIONS``)."""
        self._add(counter_event("yak_proxy_degradations_total", 1, {"reason": reason}))

    def count_mcp_tool_call(self, tool: str, outcome: str) -> None:
        """Count one MCP tool call: ``ok``, ``refused`` (a user's mistake or a bad key) or ``error``."""
        self._add(counter_event("yak_mcp_tool_calls_total", 1, {"tool": tool, "outcome": outcome}))

    def flush_due(self) -> bool:
        """Whether the buffer has waited long enough to be written."""
        return time.monotonic() - self._last_flush >= FLUSH_INTERVAL_SECONDS

    def _take(self) -> list[MetricEvent]:
        with self._lock:
            events = [MetricEvent("counter", name, value, labels) for (name, labels), value in self._counters.items()]
            events += self._observations
            self._counters, self._observations = {}, []
            self._last_flush = time.monotonic()
        return events

    def flush(self, database: Database) -> int:
        """Append the buffered events to the database; on failure they stay buffered and it re-raises.

        When it returns, every event counted before the call is in the database, also those another
        thread's flush had taken and was still writing."""
        with self._flushing:
            events = self._take()
            if not events:
                return 0
            try:
                return append_events(database, events)
            except Exception:
                for event in events:
                    self._add(event)
                raise


def _label_values(names: tuple[str, ...], key: tuple[tuple[str, str], ...]) -> list[str]:
    stored = dict(key)
    return [stored.get(name, "") for name in names]


def _counter(definition: MetricDefinition, series: dict[tuple, float]) -> Metric:
    family = CounterMetricFamily(definition.name, definition.help, labels=definition.labels)
    values = dict(series)
    if not definition.labels and not values:
        values[()] = 0.0
    for labels in definition.known_label_values:
        values.setdefault(tuple(sorted(labels.items())), 0.0)
    for key, value in sorted(values.items()):
        family.add_metric(_label_values(definition.labels, key), value)
    return family


def _histogram(definition: MetricDefinition, totals: MetricTotals) -> Metric:
    family = HistogramMetricFamily(definition.name, definition.help, labels=definition.labels)
    series = totals.histograms.get(definition.name) or {}
    if not series:
        family.add_metric([], buckets=[(_le(b), 0) for b in (*definition.buckets, math.inf)], sum_value=0.0)
    for key, histogram in sorted(series.items()):
        family.add_metric(_label_values(definition.labels, key),
                          buckets=[(_le(b), c) for b, c in histogram.buckets], sum_value=histogram.sum)
    return family


def _gauge(definition: MetricDefinition, values: Mapping[str, int]) -> Metric:
    """The queue sizes: every known queue (:data:`~yak_pipeline.core.metric_catalogue.QUEUES`), 0 when not given."""
    family = GaugeMetricFamily(definition.name, definition.help, labels=definition.labels)
    for (queue,) in definition.known:
        family.add_metric([queue], float(values.get(queue, 0)))
    return family


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def metric_families(totals: MetricTotals) -> list[Metric]:
    """Every metric family for one scrape's totals."""
    families: list[Metric] = []
    for definition in METRICS:
        if definition.kind == "counter":
            families.append(_counter(definition, totals.counters.get(definition.name, {})))
        elif definition.kind == "histogram":
            families.append(_histogram(definition, totals))
        else:
            families.append(_gauge(definition, totals.queue_sizes))
    return families


class YakCollector(Collector):
    """A prometheus_client collector that reads Yak's totals from PostgreSQL on every collect."""

    def __init__(self, read_totals: Callable[[], MetricTotals]) -> None:
        self._read_totals = read_totals

    def collect(self) -> Iterator[Metric]:
        """Yield every family, freshly read."""
        yield from metric_families(self._read_totals())

    def describe(self) -> list[Metric]:
        """Nothing up front: registering must not query the database."""
        return []


def render_metrics(read_totals: Callable[[], MetricTotals], accept: str | None = None) -> tuple[bytes, str]:
    """The metrics in the format the scraper's ``Accept`` header asks for, and its content type
    (Prometheus text 0.0.4 by default; OpenMetrics or text 1.0 when asked)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(YakCollector(read_totals))
    encode, content_type = choose_encoder(accept or "")
    return encode(registry), content_type
