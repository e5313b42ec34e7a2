"""``/metrics``: the Prometheus metrics (admin key)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from yak_pipeline.api.dependencies import Caller, Services
from yak_pipeline.api.metrics import render_metrics
from yak_pipeline.services.metrics import metric_totals

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

    body, content_type = render_metrics(lambda: metric_totals(database, services.alerter), request.headers.get("accept"))
    return Response(body, headers={"Content-Type": content_type})
