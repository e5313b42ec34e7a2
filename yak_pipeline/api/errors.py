"""Every error the API answers is ``{"detail": "<one line>"}`` with the right status, never a traceback.

- 422: the body or a parameter is invalid (``errors`` lists each field and reason);
- 404: no such id *for this caller*; 413: body over 1 MiB;
- 503 with ``Retry-After``: the database cannot be reached (and a ``db_connection_lost`` alert);
- 500: a bug; the traceback goes to the server log only.

Under ``/v1`` (the memory proxy, which speaks OpenAI's protocol) the same answers also carry
OpenAI's ``{"error": {"message", "type", "param", "code"}}``, which OpenAI clients show.
"""

from __future__ import annotations

import json
import logging
from typing import Final

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from yak_pipeline.api.proxy_anthropic import AnthropicProxyError, anthropic_error_type
from yak_pipeline.api.proxy_http import PROXY_PREFIX
from yak_pipeline.core.secrets import SecretRefused
from yak_pipeline.core.types import InvalidUserId
from yak_pipeline.llm.errors import one_line as collapse_to_one_line
from yak_pipeline.recall_models import RelevanceModelMissing
from yak_pipeline.services.memories import ExchangeForgotten
from yak_pipeline.services.proxy_exchange import ProxyError
from yak_pipeline.store.errors import DatabaseUnavailable, StoreError

logger = logging.getLogger("yak.api")

RETRY_AFTER_SECONDS: Final = 5
MAX_BODY_BYTES: Final = 1024 * 1024
_MAX_DETAIL_CHARS: Final = 300


def body_too_large_detail(size: int | None = None, max_bytes: int = MAX_BODY_BYTES) -> str:
    """The one line a 413 answers: the limit, and the body's size when it was declared."""
    limit = f"{max_bytes // (1024 * 1024)} MiB ({max_bytes} bytes)"
    if size is None:
        return f"request body is larger than the limit of {limit}"
    return f"request body of {size} bytes is larger than the limit of {limit}"


def one_line(text: object) -> str:
    """``text`` on a single line, cut to a readable length (an API error's ``detail``)."""
    return collapse_to_one_line(text, _MAX_DETAIL_CHARS)


def _with_openai_error(request: Request, body: dict, status_code: int) -> dict:
    """``body`` plus OpenAI's error object when the request was to the memory proxy (Anthropic's on ``/v1/messages``)."""
    if request.url.path.startswith(PROXY_PREFIX + "/messages"):
        error = AnthropicProxyError(status_code, body["detail"], error_type=anthropic_error_type(status_code))
        return {**body, **error.body()}
    if request.url.path.startswith(PROXY_PREFIX + "/"):
        error_type = "invalid_request_error" if status_code < 500 else "server_error"
        body = {**body, "error": ProxyError(status_code, body["detail"], error_type=error_type).body()["error"]}
    return body


def _field(loc: tuple | list) -> str:
    parts = [str(p) for p in loc]
    if len(parts) > 1 and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    return ".".join(parts) or "body"


def _validation_response(exc: RequestValidationError) -> JSONResponse:
    errors = []
    for error in exc.errors():
        reason = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        if error.get("type") == "json_invalid":
            field, reason = "body", f"invalid JSON ({(error.get('ctx') or {}).get('error', 'decode error')})"
        else:
            field = _field(error.get("loc", ()))
        errors.append({"field": field, "reason": one_line(reason)})
    first = errors[0] if errors else {"field": "body", "reason": "invalid"}
    detail = f"{first['field']}: {first['reason']}"
    if len(errors) > 1:
        detail += f" (and {len(errors) - 1} more)"
    return JSONResponse({"detail": detail, "errors": errors}, status_code=422)


def database_unavailable_response(app: FastAPI, exc: Exception) -> JSONResponse:
    """503 with Retry-After; counts the error and raises the (de-duplicated) critical alert."""
    services = app.state.services
    reason = one_line(exc)
    services.metrics.count_error("db_connection_lost")
    services.alerter.alert("db_connection_lost", "the API cannot reach the database", level="critical", error=reason)
    return JSONResponse({"detail": "the database is unavailable; try again shortly"}, status_code=503,
                        headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


# What the OpenAPI document says a 422 looks like: the body the handlers above really send, not
# FastAPI's default (``detail`` as a list), which every generated client would have parsed wrongly.
_VALIDATION_ERROR_SCHEMA: Final = {
    "title": "HTTPValidationError",
    "type": "object",
    "description": "One line saying what is wrong; for invalid fields, each field and its reason.",
    "required": ["detail"],
    "properties": {
        "detail": {"type": "string", "title": "Detail"},
        "errors": {"type": "array", "title": "Errors", "items": {"$ref": "#/components/schemas/ValidationError"}},
    },
}
_FIELD_ERROR_SCHEMA: Final = {
    "title": "ValidationError",
    "type": "object",
    "required": ["field", "reason"],
    "properties": {"field": {"type": "string", "title": "Field"}, "reason": {"type": "string", "title": "Reason"}},
}


def document_error_bodies(app: FastAPI) -> None:
    """Make the OpenAPI document describe 422 answers as they are sent (``detail`` is one string)."""
    generate = app.openapi

    def openapi() -> dict:
        schema = generate()
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        if "HTTPValidationError" in schemas:
            schemas["HTTPValidationError"] = dict(_VALIDATION_ERROR_SCHEMA)
            schemas["ValidationError"] = dict(_FIELD_ERROR_SCHEMA)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that turn errors into one-line JSON answers."""

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail
        if exc.status_code == 413 and not str(detail).startswith("request body"):
            detail = body_too_large_detail()
        elif exc.status_code == 404 and detail == "Not Found":
            detail = f"no route {request.method} {request.url.path}"
        return JSONResponse(_with_openai_error(request, {"detail": one_line(detail)}, exc.status_code),
                            status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(ProxyError)
    async def _proxy_error(request: Request, exc: ProxyError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status_code)

    @app.exception_handler(DatabaseUnavailable)
    async def _database_unavailable(request: Request, exc: DatabaseUnavailable) -> JSONResponse:
        # Alerting may wait on a webhook: not on the event loop.
        response = await run_in_threadpool(database_unavailable_response, app, exc)
        if request.url.path.startswith(PROXY_PREFIX + "/"):
            body = _with_openai_error(request, json.loads(bytes(response.body)), response.status_code)
            return JSONResponse(body, status_code=response.status_code, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        return response

    @app.exception_handler(InvalidUserId)
    async def _invalid_user(request: Request, exc: InvalidUserId) -> JSONResponse:
        return JSONResponse({"detail": f"user_id: {one_line(exc)}",
                             "errors": [{"field": "user_id", "reason": one_line(exc)}]}, status_code=422)

    @app.exception_handler(SecretRefused)
    async def _secret_refused(request: Request, exc: SecretRefused) -> JSONResponse:
        # YAK_SECRETS=refuse: the text held a secret; the message names its kinds, never its value.
        return JSONResponse(_with_openai_error(request, {"detail": one_line(exc)}, 422), status_code=422)

    @app.exception_handler(ExchangeForgotten)
    async def _exchange_forgotten(request: Request, exc: ExchangeForgotten) -> JSONResponse:
        # Storing a softly forgotten text again: its hidden row holds the one place it may have.
        return JSONResponse({"detail": one_line(exc)}, status_code=409)

    @app.exception_handler(psycopg.errors.DataError)
    @app.exception_handler(psycopg.errors.IntegrityError)
    async def _refused_by_database(request: Request, exc: psycopg.Error) -> JSONResponse:
        # The schema's constraints are the last line of defence; the transaction was rolled back.
        message = exc.diag.message_primary or type(exc).__name__
        return JSONResponse({"detail": f"refused by the database: {one_line(message)}"}, status_code=422)

    @app.exception_handler(StoreError)
    async def _store_error(request: Request, exc: StoreError) -> JSONResponse:
        # Schema or pgvector mismatches: the operator must fix the configuration.
        logger.error("store error: %s", exc)
        return JSONResponse({"detail": one_line(exc)}, status_code=500)

    @app.exception_handler(RelevanceModelMissing)
    async def _relevance_model_missing(request: Request, exc: RelevanceModelMissing) -> JSONResponse:
        # An embedder nobody calibrated: recall will not guess what its cosines mean.
        logger.error("%s", exc)
        return JSONResponse({"detail": one_line(exc)}, status_code=503)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error in %s %s", request.method, request.url.path)
        app.state.services.metrics.count_error("internal")
        return JSONResponse(_with_openai_error(request, {"detail": "internal error; the server log has the details"}, 500),
                            status_code=500)
