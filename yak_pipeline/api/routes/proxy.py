"""``/v1``: the memory proxy, an OpenAI chat-completions endpoint that recalls and remembers.

The flow is :mod:`yak_pipeline.services.proxy`; this module only authenticates and turns its
answers into HTTP responses. The routes speak OpenAI's protocol, not Yak's, so they are left out
of Yak's OpenAPI document (OpenAI documents them) and answer errors in OpenAI's shape.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Request, Response
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from yak_pipeline.api.auth import Principal, authenticate, key_from_headers
from yak_pipeline.api.dependencies import ApiServices, Services
from yak_pipeline.services.proxy import PROXY_MAX_BODY_BYTES, PROXY_PREFIX, ProxyAnswer, ProxyError, ProxyStream

router = APIRouter(prefix=PROXY_PREFIX, tags=["proxy"], include_in_schema=False)


async def _caller(services: ApiServices, api_key: str | None, authorization: str | None) -> Principal:
    """The key's principal; no key (or a bad one), no memory: 401 in OpenAI's error shape."""
    try:
        return await run_in_threadpool(authenticate, services, key_from_headers(api_key, authorization))
    except HTTPException as exc:
        raise ProxyError(exc.status_code, str(exc.detail).replace("missing X-API-Key header",
                         "missing API key: send a Yak key as the OpenAI API key (Authorization: Bearer) or X-API-Key"),
                         error_type="authentication_error", code="invalid_api_key") from None


def _actor(caller: Principal) -> str:
    # The audit log tells the proxy's writes from the API's: "proxy:key:abcd", "proxy:admin".
    return "proxy:" + caller.actor.removeprefix("api:")


def _response(answer: ProxyAnswer | ProxyStream) -> Response:
    if isinstance(answer, ProxyStream):
        # No buffering by proxies in front of Yak: tokens must reach the client as they come.
        return StreamingResponse(answer.chunks, media_type=answer.media_type,
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **answer.headers})
    return Response(answer.content, status_code=answer.status_code, media_type=answer.media_type,
                    headers=dict(answer.headers))


@router.post("/chat/completions", max_body_size=PROXY_MAX_BODY_BYTES)
async def chat_completions(
    request: Request,
    services: Services,
    x_api_key: Annotated[str | None, Header()] = None,
    authorization: Annotated[str | None, Header()] = None,
) -> Response:
    """OpenAI chat completions with memory: recall for the last user message, the block before it,
    the chat forwarded upstream, the answer relayed unchanged (streamed or not), the turn stored;
    ``/forget …`` commands are answered by Yak. Bodies up to 16 MiB."""
    caller = await _caller(services, x_api_key, authorization)
    raw = await request.body()
    answer = await services.proxy.chat_completions(raw, key_user=caller.user_id, actor=_actor(caller),
                                                   read_only=caller.read_only)
    return _response(answer)


@router.get("/models")
async def models(
    services: Services,
    x_api_key: Annotated[str | None, Header()] = None,
    authorization: Annotated[str | None, Header()] = None,
) -> Response:
    """The upstream's models, passed through (a Yak key is needed: the upstream is Yak's to share)."""
    await _caller(services, x_api_key, authorization)
    return _response(await services.proxy.list_models())
