"""What routes are handed: the app's parts (database, embedder, LLM, alerter; :class:`~yak_pipeline.wiring.YakParts`) and the caller.

Parts are built on first use, not at start-up, so the server starts (and ``/health`` answers)
while the database is down; a request that needs it then gets a 503 instead of a crash.
"""

from __future__ import annotations

from typing import Annotated, TypedDict, Unpack

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader

from yak_pipeline.alerts import Alerter
from yak_pipeline.api.auth import READ_ONLY_POSTS, Principal, authenticate
from yak_pipeline.api.metrics import MetricsBuffer
from yak_pipeline.embeddings import Embedder
from yak_pipeline.llm.provider import LLMProvider
from yak_pipeline.services.proxy import MemoryProxy
from yak_pipeline.services.recall_judge import LLMRecallJudge
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline.wiring import YakParts, build_parts


class ServiceParts(TypedDict, total=False):
    """The parts an app can be given instead of building them from settings (all optional).

    ``extra_admin_keys`` are accepted as admin keys besides ``YAK_ADMIN_API_KEY`` and stored
    admin keys (the in-process CLI uses a random one that never leaves its process).
    ``served=False`` (the in-process CLI) keeps its recalls out of the ``yak_recall_latency_ms``
    histogram: a fresh process loads the embedding model on its first recall, and that cold start
    is not what the histogram is for.
    """

    database: Database | None
    embedder: Embedder | None
    llm: LLMProvider | None
    alerter: Alerter | None
    extra_admin_keys: tuple[str, ...]
    served: bool


class ApiServices:
    """What one app's routes use: a view of the app's :class:`~yak_pipeline.wiring.YakParts`, with the
    app's own admin keys, request metrics and memory proxy.

    Given :class:`~yak_pipeline.settings.Settings` instead of parts, the parts are built from them
    (:func:`~yak_pipeline.wiring.build_parts`) with the database, embedder, LLM and alerter given.
    """

    def __init__(self, parts: YakParts | Settings, **given: Unpack[ServiceParts]) -> None:
        database, embedder, llm, alerter = (given.get("database"), given.get("embedder"), given.get("llm"),
                                            given.get("alerter"))
        if isinstance(parts, YakParts):
            if any(part is not None for part in (database, embedder, llm, alerter)):
                raise ValueError("give the database, embedder, LLM and alerter to build_parts, not beside YakParts")
        else:
            parts = build_parts(parts, database=database, embedder=embedder, llm=llm, alerter=alerter)
        self.parts = parts
        self.settings = parts.settings
        admin = self.settings.admin_api_key.get_secret_value() if self.settings.admin_api_key is not None else None
        self.admin_keys: tuple[str, ...] = tuple(k for k in (admin, *given.get("extra_admin_keys", ())) if k)
        self.metrics = MetricsBuffer(observe_latency=given.get("served", True))
        self._proxy: MemoryProxy | None = None

    @property
    def database(self) -> Database:
        """The migrated connection pool; raises ``DatabaseUnavailable`` while the server is down."""
        return self.parts.database

    @property
    def database_if_open(self) -> Database | None:
        """The pool if it was opened already (never tries to connect)."""
        return self.parts.database_if_open

    @property
    def embedder(self) -> Embedder:
        """The configured embedder (the local model loads on first use)."""
        return self.parts.embedder

    @property
    def llm(self) -> LLMProvider:
        """The configured LLM provider (the rules stand-in without an endpoint)."""
        return self.parts.llm

    @property
    def recall_judge(self) -> LLMRecallJudge | None:
        """The LLM's second opinion on recalled memories, when ``YAK_RECALL_LLM_JUDGE`` is on with an LLM endpoint."""
        return self.parts.judge

    @property
    def proxy(self) -> MemoryProxy:
        """The memory proxy (``/v1``), on this app's database, embedder and metrics."""
        if self._proxy is None:
            self._proxy = MemoryProxy(self.settings, database=lambda: self.database, embedder=lambda: self.embedder,
                                      metrics=self.metrics, judge=lambda: self.recall_judge)
        return self._proxy

    @property
    def proxy_if_open(self) -> MemoryProxy | None:
        """The memory proxy if a request used it (nothing to close otherwise)."""
        return self._proxy

    @property
    def alerter(self) -> Alerter:
        """The alerter; its de-duplication spans processes once the database has been reached."""
        return self.parts.alerter


def get_services(request: Request) -> ApiServices:
    """The app's :class:`ApiServices`."""
    return request.app.state.services


Services = Annotated[ApiServices, Depends(get_services)]


# Shown in the OpenAPI document as the API's security scheme; checked by get_principal.
api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False,
                              description="An admin key, or a key scoped to one user id (`yak keys create`).")


def get_principal(request: Request, services: Services,
                  key: Annotated[str | None, Security(api_key_header)]) -> Principal:
    """The caller, from the ``X-API-Key`` header (401 without a valid key).

    A read-only key gets 403 for anything but a GET and the searches: deny by default, so a route
    added later cannot let it write by forgetting to check."""
    principal = authenticate(services, key)
    if principal.read_only and request.method not in ("GET", "HEAD", "OPTIONS") \
            and request.url.path.rstrip("/") not in READ_ONLY_POSTS:
        principal.require_write()
    return principal


Caller = Annotated[Principal, Depends(get_principal)]
