"""``/metrics``: the Prometheus metrics (admin key)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from yak_pipeline.api.dependencies import Caller, Services
from yak_pipeline.api.metrics import render_metrics
from yak_pipeline.api.queue_watch import watched_queue_counts
from yak_pipeline.store.metrics import MetricTotals, read_metrics

router = APIRouter(tags=["operations"])


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format."}})
def metrics(request: Request, caller: Caller, services: Services) -> Response:
    """Counters, histograms and the queue gauge of DESIGN §6 and the memory proxy, counting the work of every process
    (API workers and pipeline runs), read from PostgreSQL at scrape time. Prometheus text
    format, or OpenMetrics when the ``Accept`` header asks for it."""
    caller.require_admin()
    database = services.database
    services.metrics.flush(database)

    def read_totals() -> MetricTotals:
        with database.connection() as conn:
            counts = watched_queue_counts(conn, services.alerter, user_id=None)
            return read_metrics(conn, queue_sizes={"memories": counts.pending_memories, "turns": counts.pending_turns})

    body, content_type = render_metrics(read_totals, request.headers.get("accept"))
    return Response(body, headers={"Content-Type": content_type})
