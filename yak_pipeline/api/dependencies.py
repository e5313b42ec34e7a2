"""What routes are handed: the app's parts (database, embedder, LLM, alerter; :class:`~yak_pipeline.wiring.YakParts`) and the caller.

Parts are built on first use, not at start-up, so the server starts (and ``/health`` answers)
while the database is down; a request that needs it then gets a 503 instead of a crash.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated, TypedDict, Unpack

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader

from yak_pipeline.alerts import Alerter
from yak_pipeline.api.auth import READ_ONLY_POSTS, Principal, authenticate
from yak_pipeline.api.metrics import MetricsBuffer
from yak_pipeline.embeddings import Embedder
from yak_pipeline.llm.provider import LLMProvider
from yak_pipeline.services.proxy import MemoryProxy
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


@dataclass(frozen=True, eq=False)
class ApiServices(YakParts):
    """What one app's routes use: the app's parts — it is a :class:`~yak_pipeline.wiring.YakParts`, a
    view of the parts it was made from (what either builds, both use) — and the app's own admin keys,
    request metrics and memory proxy. Made by :meth:`of`.
    """

    # The admin keys besides stored ones: YAK_ADMIN_API_KEY's, then the extra ones given (secrets: never in a repr).
    admin_keys: tuple[str, ...] = field(default=(), repr=False)
    metrics: MetricsBuffer = field(default_factory=MetricsBuffer, repr=False)

    @classmethod
    def of(cls, parts: YakParts | Settings, **given: Unpack[ServiceParts]) -> ApiServices:
        """The app's services on ``parts``; given :class:`~yak_pipeline.settings.Settings` instead, the parts
        are built from them (:func:`~yak_pipeline.wiring.build_parts`) with the database, embedder, LLM and
        alerter given."""
        database, embedder, llm, alerter = (given.get("database"), given.get("embedder"), given.get("llm"),
                                            given.get("alerter"))
        if isinstance(parts, YakParts):
            if any(part is not None for part in (database, embedder, llm, alerter)):
                raise ValueError("give the database, embedder, LLM and alerter to build_parts, not beside YakParts")
        else:
            parts = build_parts(parts, database=database, embedder=embedder, llm=llm, alerter=alerter)
        settings = parts.settings
        admin = settings.admin_api_key.get_secret_value() if settings.admin_api_key is not None else None
        # The parts' own store of what is built, and its lock: this view and ``parts`` build each part once.
        return cls(settings, parts._built, parts._lock,
                   admin_keys=tuple(k for k in (admin, *given.get("extra_admin_keys", ())) if k),
                   metrics=MetricsBuffer(observe_latency=given.get("served", True)))

    @cached_property
    def proxy(self) -> MemoryProxy:
        """The memory proxy (``/v1``), on this app's parts and metrics, made when a request first uses it."""
        return MemoryProxy(self, metrics=self.metrics)

    @property
    def proxy_if_open(self) -> MemoryProxy | None:
        """The memory proxy if a request used it (nothing to close otherwise)."""
        # cached_property keeps it in the instance's __dict__ (a frozen dataclass has one), under its name.
        return self.__dict__.get("proxy")


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
