"""The metrics of DESIGN §6 as the API records and serves them: append a process's buffered
events, and read every process's totals (with the watched queue sizes) at scrape time.

The catalogue (names, kinds, labels) is :mod:`yak_pipeline.core.metric_catalogue`; the event types
are defined beside their table in ``store/metrics.py`` and re-exported here, so the shells need no
store import.
"""

from __future__ import annotations

from collections.abc import Sequence

from yak_pipeline.alerts import Alerter
from yak_pipeline.services.queue_watch import watched_queue_counts
from yak_pipeline.store.database import Database
from yak_pipeline.store.metrics import (
    MetricEvent,
    MetricTotals,
    append_metric_events,
    counter_event,
    observation_event,
    read_metrics,
)

__all__ = ["MetricEvent", "MetricTotals", "append_events", "counter_event", "metric_totals", "observation_event"]


def append_events(db: Database, events: Sequence[MetricEvent]) -> int:
    """Append a process's metric events in one transaction; how many rows were written."""
    with db.connection() as conn:
        return append_metric_events(conn, events)


def metric_totals(db: Database, alerter: Alerter) -> MetricTotals:
    """Every process's metrics as of now, with the (watched) queue sizes as gauges."""
    with db.connection() as conn:
        counts = watched_queue_counts(conn, alerter, user_id=None)
        return read_metrics(conn, queue_sizes={"memories": counts.pending_memories, "turns": counts.pending_turns})
