"""ASGI middleware counting every answered request for ``yak_requests_total``.

Requests are labelled with the route's path template (``/api/memories/{memory_id}``), never the
raw path, so ids do not become label values; paths that match no route count as ``unmatched``.
"""

from __future__ import annotations

import logging

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger("yak.api")


def route_label(scope: Scope) -> str:
    """The matched route's path template, without a trailing slash (both spellings are one route)."""
    path = getattr(scope.get("route"), "path", None)
    if not path:
        return "unmatched"
    return path.rstrip("/") or "/"


class RequestMetricsMiddleware:
    """Counts requests by method, route and status, and writes the buffer out when it is due."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status_code = 500

        async def send_recording_status(message: Message) -> None:
            nonlocal status_code
            if message["type"] == "http.response.start":
                status_code = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_recording_status)
        finally:
            services = scope["app"].state.services
            services.metrics.count_request(scope["method"], route_label(scope), status_code)
            database = services.database_if_open
            if database is not None and services.metrics.flush_due():
                try:
                    await run_in_threadpool(services.metrics.flush, database)
                except Exception as exc:  # noqa: BLE001 - kept buffered; the next flush retries
                    logger.warning("could not write request metrics yet: %s", type(exc).__name__)
