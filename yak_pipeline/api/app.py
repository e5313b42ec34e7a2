"""The FastAPI app: ``create_app(settings)`` wires the routes, auth, error answers and metrics.

OpenAPI is served at ``/openapi.json``, browsable at ``/docs`` (and ``/redoc``) with their
scripts and styles served by Yak itself (``fastapi-offline``), so they work without internet.
The web page is under ``/ui`` (:mod:`yak_pipeline.api.ui`). Bodies over 1 MiB are refused
with a JSON 413 naming the limit, before they are read in full (:mod:`yak_pipeline.api.body_limit`;
the memory proxy's chats: 16 MiB). The memory proxy is under ``/v1``; ``create_proxy_app`` serves
it alone (``yak proxy``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Unpack

from fastapi import APIRouter, FastAPI
from fastapi_offline import FastAPIOffline
from starlette.concurrency import run_in_threadpool

from yak_pipeline import __version__
from yak_pipeline.api.body_limit import BodyLimitMiddleware
from yak_pipeline.api.dependencies import ApiServices, ServiceParts
from yak_pipeline.api.errors import document_error_bodies, install_error_handlers
from yak_pipeline.api.proxy_http import PROXY_MAX_BODY_BYTES, PROXY_PREFIX
from yak_pipeline.api.request_metrics import RequestMetricsMiddleware
from yak_pipeline.api.routes import ROUTERS, health, proxy
from yak_pipeline.api.ui import install_web_page
from yak_pipeline.embeddings import Embedder
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline.wiring import YakParts, process_parts

logger = logging.getLogger("yak.api")

DESCRIPTION = """Yak remembers conversations for your LLM: post exchanges, recall the right
memories for the next prompt, and curate what it keeps.

Every route but `/health` needs an `X-API-Key` header: an admin key, or a key scoped to one
user id, which can never read or change another user's data."""


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    services: ApiServices = app.state.services
    if getattr(app.state, "warm_documents", False):
        # The proxy stores every turn it answers, each embedded with the document model: loaded now,
        # in the background (startup and /health do not wait), not by the first turn's store.
        services.proxy.warm_documents_in_background()
    yield
    if services.proxy_if_open is not None:
        await services.proxy_if_open.aclose()
    # Request counts and latencies still buffered are written before the process goes.
    database = services.database_if_open
    if database is not None:
        try:
            await run_in_threadpool(services.metrics.flush, database)
        except Exception as exc:  # noqa: BLE001 - shutting down; nothing else to do with them
            logger.warning("request metrics not written at shutdown: %s", type(exc).__name__)


def create_app(
    settings: YakParts | Settings | None = None,
    *,
    routers: tuple[APIRouter, ...] = ROUTERS,
    web_page: bool = True,
    **parts: Unpack[ServiceParts],
) -> FastAPI:
    """The API on ``settings``' parts (:class:`~yak_pipeline.wiring.YakParts`, or built from the
    settings given; default: the environment's, for ``uvicorn … create_app --factory``), memory
    proxy included.

    ``parts`` (:class:`~yak_pipeline.api.dependencies.ServiceParts`: database, embedder, LLM,
    alerter, extra admin keys, ``served``) are used as given; those not given are built from
    settings on first use. ``routers`` narrows what is served; ``web_page=False`` leaves out the
    page at ``/ui``.
    """
    settings = settings if settings is not None else process_parts()
    # /docs and /redoc load Swagger UI and ReDoc from Yak, not from a CDN: they work offline.
    app = FastAPIOffline(title="Yak", version=__version__, description=DESCRIPTION, lifespan=_lifespan,
                         static_url="/docs-static")
    app.state.services = ApiServices.of(settings, **parts)
    install_error_handlers(app)
    document_error_bodies(app)
    # The middleware added last is outermost: bodies refused with 413 are still counted as requests.
    app.add_middleware(BodyLimitMiddleware,
                       path_limits={f"{PROXY_PREFIX}/{path}": PROXY_MAX_BODY_BYTES
                                    for path in ("chat/completions", "messages", "messages/count_tokens")})
    app.add_middleware(RequestMetricsMiddleware)
    for router in routers:
        app.include_router(router)
    if web_page:
        install_web_page(app)
    return app


def create_proxy_app(settings: YakParts | Settings | None = None, *, database: Database | None = None,
                     embedder: Embedder | None = None) -> FastAPI:
    """The memory proxy alone (``/v1`` and ``/health``), for ``yak proxy``; it loads the document model
    in the background as it starts (``MemoryProxy.warm_documents_in_background``)."""
    app = create_app(settings, database=database, embedder=embedder, routers=(proxy.router, health.router),
                     web_page=False)
    app.state.warm_documents = True
    return app
