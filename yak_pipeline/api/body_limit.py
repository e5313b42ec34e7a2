"""Refuse request bodies over :data:`~yak_pipeline.api.errors.MAX_BODY_BYTES` with a JSON 413 naming the limit.

FastAPI's own ``max_body_size`` answers a declared oversize body with Starlette's plain-text
"Content Too Large" (its responder replaces whatever the app sends), so clients got neither the
API's ``{"detail": …}`` shape nor the limit. This middleware refuses a declared ``Content-Length``
before reading anything, and a body sent without one (chunked) as soon as it passes the limit.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from yak_pipeline.api.errors import MAX_BODY_BYTES, body_too_large_detail


class BodyTooLarge(HTTPException):
    """A streamed body passed the limit; the API's HTTP error handler answers it (JSON 413)."""

    def __init__(self, max_bytes: int = MAX_BODY_BYTES) -> None:
        super().__init__(status_code=413, detail=body_too_large_detail(max_bytes=max_bytes))


class BodyLimitMiddleware:
    """Answers 413 in the API's JSON error shape for bodies over ``max_bytes``.

    ``path_limits`` gives some paths their own limit (the memory proxy's chats carry whole
    conversations: ``api.proxy_http.PROXY_MAX_BODY_BYTES``).
    """

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES,
                 path_limits: Mapping[str, int] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.path_limits = dict(path_limits or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes = self.path_limits.get(scope.get("path", ""), self.max_bytes)
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_bytes:
            response = JSONResponse({"detail": body_too_large_detail(int(declared), max_bytes)}, status_code=413,
                                    headers={"Connection": "close"})
            await response(scope, receive, send)
            return
        received = 0

        async def receive_within_limit() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_bytes:
                    raise BodyTooLarge(max_bytes)
            return message

        await self.app(scope, receive_within_limit, send)
