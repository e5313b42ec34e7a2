"""``/v1``: the memory proxy, an OpenAI chat-completions endpoint and an Anthropic Messages endpoint
that recall and remember, on one port.

The protocols are :mod:`yak_pipeline.api.proxy_openai` and :mod:`yak_pipeline.api.proxy_anthropic`
over the memory flow of :mod:`yak_pipeline.services.proxy`; this module only authenticates and
turns their answers into HTTP responses. The routes speak
OpenAI's and Anthropic's protocols, not Yak's, so they are left out of Yak's OpenAPI document and
answer errors in their protocol's shape.

Keys on ``/v1/messages``: Anthropic clients send one API key (``x-api-key``, or ``Authorization:
Bearer`` for Claude Code's subscription login). With ``YAK_UPSTREAM_ANTHROPIC_API_KEY`` set, that key
is the Yak key and Yak's own key goes upstream. Without it, the client's key goes upstream as it came
and the Yak key travels in ``X-Yak-Key`` (Claude Code: ``ANTHROPIC_CUSTOM_HEADERS``). A Yak key is
never sent upstream.
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi import APIRouter, HTTPException, Request, Response
from starlette.concurrency import run_in_threadpool

from yak_pipeline.api import proxy_anthropic, proxy_openai
from yak_pipeline.api.auth import Principal, authenticate, key_from_headers
from yak_pipeline.api.dependencies import ApiServices, Services
from yak_pipeline.api.proxy_anthropic import YAK_KEY_HEADER, AnthropicProxyError
from yak_pipeline.api.proxy_http import PROXY_MAX_BODY_BYTES, PROXY_PREFIX, proxy_response
from yak_pipeline.services.proxy_exchange import ProxyError

router = APIRouter(prefix=PROXY_PREFIX, tags=["proxy"], include_in_schema=False)


async def _openai_caller(services: ApiServices, headers: Mapping[str, str]) -> Principal:
    """The caller of an OpenAI request (its key in ``X-API-Key`` or ``Authorization: Bearer``); no key
    (or a bad one), no memory: 401 in OpenAI's error shape."""
    try:
        return await run_in_threadpool(authenticate, services,
                                       key_from_headers(headers.get("x-api-key"), headers.get("authorization")))
    except HTTPException as exc:
        raise ProxyError(exc.status_code, str(exc.detail).replace("missing X-API-Key header",
                         "missing API key: send a Yak key as the OpenAI API key (Authorization: Bearer) or X-API-Key"),
                         error_type="authentication_error", code="invalid_api_key") from None


def anthropic_credentials(headers: Mapping[str, str], own_key: str | None) -> tuple[str | None, dict[str, str]]:
    """The Yak key of an Anthropic request and the credentials that go upstream (module docstring)."""
    client: dict[str, str] = {}
    if headers.get("x-api-key"):
        client = {"x-api-key": headers["x-api-key"]}
    elif headers.get("authorization"):
        client = {"authorization": headers["authorization"]}
    own = {"x-api-key": own_key} if own_key else {}
    if headers.get(YAK_KEY_HEADER):
        return headers[YAK_KEY_HEADER], own or client
    # The client's one key is Yak's: only Yak's own upstream key may go upstream.
    return key_from_headers(headers.get("x-api-key"), headers.get("authorization")), own


async def _anthropic_caller(services: ApiServices, headers: Mapping[str, str]) -> tuple[Principal, dict[str, str]]:
    """The caller of an Anthropic request and the upstream credentials; 401 in Anthropic's shape."""
    own = services.settings.upstream_anthropic_api_key
    yak_key, credentials = anthropic_credentials(headers, own.get_secret_value() if own is not None else None)
    if not yak_key or not credentials:
        # No X-Yak-Key and no key of Yak's own: the client's key is its Anthropic key, not a Yak key.
        raise AnthropicProxyError(401, "missing Yak API key: send it in the X-Yak-Key header (your Anthropic key "
                                       "stays the API key), or as the API key when the proxy has its own "
                                       "YAK_UPSTREAM_ANTHROPIC_API_KEY", error_type="authentication_error")
    try:
        caller = await run_in_threadpool(authenticate, services, yak_key)
    except HTTPException as exc:
        raise AnthropicProxyError(exc.status_code, f"invalid Yak API key ({exc.detail})",
                                  error_type="authentication_error") from None
    return caller, credentials


def _actor(caller: Principal) -> str:
    # The audit log tells the proxy's writes from the API's: "proxy:key:abcd", "proxy:admin".
    return "proxy:" + caller.actor.removeprefix("api:")


@router.post("/chat/completions", max_body_size=PROXY_MAX_BODY_BYTES)
async def chat_completions(request: Request, services: Services) -> Response:
    """OpenAI chat completions with memory: recall for the last user message, the block before it,
    the chat forwarded upstream, the answer relayed unchanged (streamed or not), the turn stored;
    ``/forget …`` commands are answered by Yak. Bodies up to 16 MiB."""
    caller = await _openai_caller(services, request.headers)
    raw = await request.body()
    return proxy_response(await proxy_openai.chat_completions(services.proxy, raw, key_user=caller.user_id,
                                                              actor=_actor(caller), read_only=caller.read_only))


@router.post("/messages", max_body_size=PROXY_MAX_BODY_BYTES)
async def messages(request: Request, services: Services) -> Response:
    """Anthropic Messages with memory (Claude Code, the Anthropic SDKs): recall for the turn's prompt, the
    block joined to ``system``, the body forwarded upstream, every event relayed unchanged, the finished
    turn stored; ``/forget …`` commands are answered by Yak. Bodies up to 16 MiB."""
    caller, credentials = await _anthropic_caller(services, request.headers)
    raw = await request.body()
    return proxy_response(await proxy_anthropic.create_message(
        services.proxy, raw, query=request.url.query, client_headers=request.headers, credentials=credentials,
        key_user=caller.user_id, actor=_actor(caller), read_only=caller.read_only))


@router.post("/messages/count_tokens", max_body_size=PROXY_MAX_BODY_BYTES)
async def count_tokens(request: Request, services: Services) -> Response:
    """Anthropic's token count, passed through unchanged (no memory: Claude Code sizes its context with it)."""
    _, credentials = await _anthropic_caller(services, request.headers)
    return proxy_response(await proxy_anthropic.pass_through(
        services.proxy, "POST", "/v1/messages/count_tokens", query=request.url.query, raw=await request.body(),
        client_headers=request.headers, credentials=credentials))


@router.get("/models")
async def models(request: Request, services: Services) -> Response:
    """The upstream's models, passed through (a Yak key is needed: the upstream is Yak's to share); an
    ``anthropic-version`` header asks the Anthropic upstream."""
    if "anthropic-version" in request.headers:
        _, credentials = await _anthropic_caller(services, request.headers)
        return proxy_response(await proxy_anthropic.pass_through(
            services.proxy, "GET", "/v1/models", query=request.url.query, raw=None, client_headers=request.headers,
            credentials=credentials))
    await _openai_caller(services, request.headers)
    return proxy_response(await proxy_openai.list_models(services.proxy))
