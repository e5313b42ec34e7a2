"""``/health``: can the API reach its database, embedder and LLM? (No key needed.)"""

from __future__ import annotations

from typing import Final

import httpx
from fastapi import APIRouter
from fastapi.responses import JSONResponse

from yak_pipeline.api.dependencies import ApiServices, Services
from yak_pipeline.api.errors import RETRY_AFTER_SECONDS, one_line
from yak_pipeline.api.schemas.operations import ComponentHealth, HealthOut
from yak_pipeline.llm.rules import RulesProvider

router = APIRouter(tags=["operations"])

PROBE_TIMEOUT_SECONDS: Final = 5.0


def _database(services: ApiServices) -> ComponentHealth:
    try:
        services.database.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means "not reachable"
        # No server address in an unauthenticated answer: the log has the details.
        return ComponentHealth(ok=False, detail=f"unreachable ({type(exc).__name__})")
    return ComponentHealth(ok=True, detail="reachable")


def _embedder(services: ApiServices) -> ComponentHealth:
    try:
        embedder = services.embedder
        vector = embedder.embed_query("health check")
    except Exception as exc:  # noqa: BLE001
        return ComponentHealth(ok=False, detail=f"failed ({type(exc).__name__})")
    return ComponentHealth(ok=len(vector) == embedder.dimensions,
                           detail=f"{embedder.model_name} ({embedder.dimensions} dimensions)")


def _llm(services: ApiServices) -> ComponentHealth:
    try:
        provider = services.llm
    except Exception as exc:  # noqa: BLE001
        return ComponentHealth(ok=False, detail=f"misconfigured ({type(exc).__name__})")
    if isinstance(provider, RulesProvider):
        return ComponentHealth(ok=True, detail="offline rules provider (YAK_LLM_BASE_URL unset)")
    settings = services.settings
    if settings.llm_base_url is None:
        # A provider given to the services directly, not built from the settings: no endpoint to probe.
        return ComponentHealth(ok=True, detail=f"{type(provider).__name__} (YAK_LLM_BASE_URL unset)")
    key = settings.llm_api_key.get_secret_value() if settings.llm_api_key is not None else None
    try:
        # Listing models is the cheapest request every OpenAI-compatible server answers.
        response = httpx.get(f"{settings.llm_base_url.rstrip('/')}/models", timeout=PROBE_TIMEOUT_SECONDS,
                             headers={"Authorization": f"Bearer {key}"} if key else {})
    except httpx.HTTPError as exc:
        return ComponentHealth(ok=False, detail=f"unreachable ({type(exc).__name__})")
    if response.status_code >= 500:
        return ComponentHealth(ok=False, detail=f"answered HTTP {response.status_code}")
    return ComponentHealth(ok=True, detail=one_line(f"reachable ({settings.llm_model})"))


@router.get("/health", response_model=HealthOut, responses={503: {"model": HealthOut}})
def health(services: Services) -> JSONResponse:
    """Whether the database, the embedder and the LLM answer. 200 when the database does
    (the API can work), 503 with ``Retry-After`` when it does not."""
    report = HealthOut(status="ok", database=_database(services), embedder=_embedder(services), llm=_llm(services))
    if not (report.database.ok and report.embedder.ok and report.llm.ok):
        report.status = "degraded"
    if report.database.ok:
        return JSONResponse(report.model_dump(), status_code=200)
    return JSONResponse(report.model_dump(), status_code=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
