"""Queue sizes for ``/api/queue``, ``/metrics`` and the web page, and the ``queue_overflow`` alert.

The threshold is a constant here because settings.py has no field for it yet; a deployment
whose pipeline is down (or far behind) crosses it and gets one alert per dedup window.
"""

from __future__ import annotations

from typing import Any, Final

import psycopg

from yak_pipeline.alerts import Alerter
from yak_pipeline.store.database import Database
from yak_pipeline.store.queue import QueueCounts, failed_items, queue_counts

QUEUE_OVERFLOW_THRESHOLD: Final = 1000
"""Pending memories plus pending turns above which the ``queue_overflow`` alert fires."""


def watched_queue_counts(conn: psycopg.Connection, alerter: Alerter, *, user_id: str | None) -> QueueCounts:
    """Queue counts (for one user, or all); checks the whole queue against the overflow threshold."""
    overall = queue_counts(conn)
    if overall.pending > QUEUE_OVERFLOW_THRESHOLD:
        alerter.alert("queue_overflow", f"{overall.pending} items wait for the pipeline "
                      f"(more than {QUEUE_OVERFLOW_THRESHOLD}); is the Dagster daemon running?",
                      error=f"{overall.pending_memories} memories, {overall.pending_turns} turns pending")
    return overall if user_id is None else queue_counts(conn, user_id=user_id)


def queue_status(db: Database, alerter: Alerter, *, user_id: str | None) -> tuple[QueueCounts, list[dict[str, Any]]]:
    """Queue counts (watched for overflow) and the latest failed items, for one user or all."""
    with db.connection() as conn:
        return watched_queue_counts(conn, alerter, user_id=user_id), failed_items(conn, user_id=user_id)
