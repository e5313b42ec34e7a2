"""The memory proxy in Anthropic's Messages API (issue 34): ``POST /v1/messages`` for Claude Code and every
Anthropic client, beside the OpenAI protocol of :mod:`yak_pipeline.services.proxy` on the same port.

Only the wire protocol lives here; the memory flow is :class:`~yak_pipeline.services.proxy.MemoryProxy`'s,
the same for both protocols (recall → block, forget in chat, the turn stored after the answer):

1. the user is the key's; an admin key names one in ``metadata.user_id``;
2. a forget command as the user's last message is answered by Yak in the Messages protocol and never
   goes upstream;
3. recall runs on what the person typed in the turn's prompt (text blocks only: ``tool_result`` blocks
   and Claude Code's own ``<system-reminder>``, hook and local-command text are not the user's words),
   and the block joins ``system`` as the client sent it: appended to a string, added as the last text
   block of a list (after any ``cache_control`` breakpoint, so the client's cached prefix stays the
   same), or the whole ``system`` when there was none;
4. the body goes upstream otherwise unchanged (``YAK_UPSTREAM_ANTHROPIC_BASE_URL``), with the client's
   ``anthropic-*`` headers; the answer comes back unchanged: the same body, or every server-sent event
   byte for byte (``message_start`` … ``message_stop``, ``ping``, ``error``, tool-use input deltas);
5. a finished answer (any stop reason but ``tool_use``/``pause_turn``) with text is stored as the turn
   (the prompt's text, the answer's text). In an agent's loop (Claude Code) the prompt is answered by
   tool calls, their results go back as a user message of ``tool_result`` blocks, and so on: that
   continuation is recalled for with the same prompt (the ``system`` the model sees stays the same
   through the loop), and the loop's final answer is stored, once, as the prompt's turn.

As on the OpenAI path, a stream that breaks off stores nothing and ends in an ``error`` event the
SDKs raise. Errors are Anthropic's shape, ``{"type": "error", "error": {"type", "message"}}``;
the upstream's own errors are passed on as they came.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import httpx

from yak_pipeline.core.conversation_query import recall_queries
from yak_pipeline.ingestion.formats.claude_code_sessions import without_client_meta
from yak_pipeline.services.proxy import (
    RECALLED_IDS_HEADER,
    MemoryProxy,
    ProxyAnswer,
    ProxyError,
    ProxyStream,
    TurnStore,
    resolve_named_user,
    upstream_error,
)

# The header an Anthropic client sends Yak's key in when its own API key goes upstream
# (Claude Code: ANTHROPIC_CUSTOM_HEADERS="X-Yak-Key: …"; the SDKs: default_headers).
YAK_KEY_HEADER: Final = "x-yak-key"
# Where the Messages API lives under the upstream's base URL (Anthropic's clients add it themselves).
_MESSAGES_PATH: Final = "/v1/messages"
# Upstream response headers the client gets back: request ids, rate limits, retry advice.
_PASSED_BACK_PREFIXES: Final = ("anthropic-", "request-id", "retry-after", "x-should-retry")
# What each status is called in Anthropic's error objects (the SDKs map them to exception classes).
_ERROR_TYPES: Final = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                       404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                       529: "overloaded_error"}
# Stop reasons after which the model is not done: the loop goes on, nothing is stored yet.
_UNFINISHED_STOPS: Final = frozenset({"tool_use", "pause_turn"})
_TOOL_USE_BLOCKS: Final = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})


def anthropic_error_type(status_code: int) -> str:
    """Anthropic's name for an error of ``status_code``."""
    return _ERROR_TYPES.get(status_code, "invalid_request_error" if status_code < 500 else "api_error")


class AnthropicProxyError(ProxyError):
    """A request ``/v1/messages`` answers with an error, in Anthropic's shape (plus Yak's one-line ``detail``)."""

    def body(self) -> dict[str, Any]:
        """``{"type": "error", "error": {type, message}, "detail": message}``."""
        return {"type": "error", "error": {"type": self.error_type, "message": self.message}, "detail": self.message}


def as_anthropic_error(exc: ProxyError) -> AnthropicProxyError:
    """``exc`` (raised by the shared flow in OpenAI's terms) in Anthropic's terms."""
    if isinstance(exc, AnthropicProxyError):
        return exc
    return AnthropicProxyError(exc.status_code, exc.message, error_type=anthropic_error_type(exc.status_code),
                               code=exc.code, param=exc.param)


def error_event(message: str, error_type: str = "api_error") -> bytes:
    """An ``error`` server-sent event (how Anthropic reports a stream failing midway; the SDKs raise it)."""
    data = json.dumps({"type": "error", "error": {"type": error_type, "message": message}})
    return f"event: error\ndata: {data}\n\n".encode()


# --- reading the request -----------------------------------------------------------------------

@dataclass(frozen=True)
class MessagesRequest:
    """A Messages body, checked for what Yak reads; everything else passes through as sent."""

    body: dict[str, Any]
    stream: bool
    # What the person typed in this turn's prompt (None: nothing to recall for or store).
    prompt_text: str | None
    recall_texts: tuple[str, ...]
    # The prompt is text only (no images or documents) and the last message is the user's: a turn
    # can be stored at full fidelity.
    storable: bool
    # The prompt itself is the last message (not a tool result going back): a forget command there is Yak's.
    prompt_is_last: bool


def _typed(content: object) -> tuple[str | None, bool, bool]:
    """A user message's typed text (Claude Code's meta text left out), whether it is only text, and
    whether it carries tool results."""
    if isinstance(content, str):
        text = without_client_meta(content)
        return (text or None), True, False
    if not isinstance(content, list):
        return None, False, False
    texts, text_only, tool_results = [], True, False
    for block in content:
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text" and isinstance(block.get("text"), str):
            text = without_client_meta(block["text"])
            if text:
                texts.append(text)
        elif kind == "tool_result":
            tool_results = True
        else:
            text_only = False
    return ("\n\n".join(texts) if texts else None), text_only, tool_results


def _invalid(message: str) -> AnthropicProxyError:
    return AnthropicProxyError(400, message, error_type="invalid_request_error")


def parse_messages_request(raw: bytes, *, follow_up_words: int = 0) -> MessagesRequest:
    """Check a Messages body as far as Yak reads it; raises :class:`AnthropicProxyError` (400) saying what is wrong."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _invalid(f"body: invalid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise _invalid("body: must be a JSON object with 'model', 'max_tokens' and 'messages'")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _invalid("messages: must be a non-empty list of messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise _invalid(f"messages.{index}: each message must be an object whose 'role' is 'user' or 'assistant'")
    if "system" in body and not isinstance(body["system"], (str, list, type(None))):
        raise _invalid("system: must be a string or a list of text blocks")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise _invalid("stream: must be true or false")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise _invalid("metadata: must be an object")
    typed = [(_typed(m.get("content")), i) for i, m in enumerate(messages) if m["role"] == "user"]
    # The turn's prompt: the last user message with typed text (later ones carry only tool results).
    prompt = next(((t, i) for t, i in reversed(typed) if t[0] is not None), None)
    last_is_user = messages[-1]["role"] == "user"
    if prompt is None or not last_is_user:
        # No prompt, or an assistant prefill to continue: pass through, nothing recalled or stored.
        return MessagesRequest(body, stream, None, (), False, False)
    (text, text_only, _), index = prompt
    earlier = [t[0] for t, i in typed if i < index and t[0] is not None]
    recall_texts = recall_queries([*earlier, text], follow_up_words=follow_up_words)
    return MessagesRequest(body, stream, text, tuple(recall_texts), storable=text_only,
                           prompt_is_last=index == len(messages) - 1)


def with_memory_block(system: object, block: str) -> str | list[Any]:
    """``system`` with the memory block joined to it, in the form the client used (module docstring, 3)."""
    if isinstance(system, list):
        return [*system, {"type": "text", "text": block}]
    if isinstance(system, str) and system.strip():
        return f"{system}\n\n{block}"
    return block


# --- Yak's own answers (forget commands) -------------------------------------------------------

def yak_message(text: str, *, body: Mapping[str, Any], stream: bool) -> ProxyAnswer | ProxyStream:
    """``text`` as the assistant's answer in the Messages protocol, streamed if asked."""
    from uuid import uuid4  # noqa: PLC0415 - only forget commands need an id

    model = body.get("model") if isinstance(body.get("model"), str) else "yak"
    message = {"id": f"msg_yak_{uuid4().hex}", "type": "message", "role": "assistant", "model": model,
               "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
               "usage": {"input_tokens": 0, "output_tokens": 0}}
    if not stream:
        return ProxyAnswer(200, json.dumps(message).encode("utf-8"), "application/json")
    events = [
        ("message_start", {"type": "message_start",
                           "message": {**message, "content": [], "stop_reason": None}}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": text}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                           "usage": {"output_tokens": 0}}),
        ("message_stop", {"type": "message_stop"}),
    ]

    async def relay() -> AsyncIterator[bytes]:
        for name, data in events:
            yield f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

    return ProxyStream(relay())


# --- reading the upstream's answer -------------------------------------------------------------

def answer_of_message(body: object) -> tuple[str | None, bool]:
    """The text of a finished ``message`` body (None: tool use, unfinished, or no text) and whether it is one."""
    if not isinstance(body, dict) or body.get("type") != "message" or not isinstance(body.get("content"), list):
        return None, False
    blocks = [b for b in body["content"] if isinstance(b, dict)]
    if body.get("stop_reason") in _UNFINISHED_STOPS or any(b.get("type") in _TOOL_USE_BLOCKS for b in blocks):
        return None, True
    text = "".join(b["text"] for b in blocks if b.get("type") == "text" and isinstance(b.get("text"), str))
    return (text if text.strip() else None), True


@dataclass
class StreamedMessage:
    """The answer carried by a Messages event stream, gathered as the bytes go by."""

    text: list[str] = field(default_factory=list)
    stop_reason: str | None = None
    tool_use: bool = False
    stopped: bool = False  # message_stop seen
    error: bool = False
    _pending: bytes = b""

    def feed(self, chunk: bytes) -> None:
        """Read the complete lines of ``chunk`` (a partial line waits for the next chunk)."""
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            self._read_line(line.strip())

    def _read_line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return  # "event:" lines name what the data line says again in its "type"
        try:
            event = json.loads(line[5:].strip())
        except (UnicodeDecodeError, json.JSONDecodeError):
            self.error = True
            return
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if kind == "content_block_start":
            block = event.get("content_block")
            if isinstance(block, dict) and block.get("type") in _TOOL_USE_BLOCKS:
                self.tool_use = True
        elif kind == "content_block_delta":
            delta = event.get("delta")
            if isinstance(delta, dict) and delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                self.text.append(delta["text"])
        elif kind == "message_delta":
            delta = event.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
                self.stop_reason = delta["stop_reason"]
        elif kind == "message_stop":
            self.stopped = True
        elif kind == "error":
            self.error = True

    @property
    def complete(self) -> bool:
        """The stream said it finished (``message_stop``) and carried no error."""
        return self.stopped and not self.error

    @property
    def answer(self) -> str | None:
        """The text to store as the turn's answer: None while the model is not done (tool use) or said nothing."""
        if not self.complete or self.tool_use or self.stop_reason in _UNFINISHED_STOPS:
            return None
        text = "".join(self.text)
        return text if text.strip() else None


def passed_back_headers(headers: httpx.Headers) -> dict[str, str]:
    """The upstream's response headers the client reads (request id, rate limits, retry advice)."""
    return {k: v for k, v in headers.items() if k.lower().startswith(_PASSED_BACK_PREFIXES)}


def forwarded_headers(client_headers: Mapping[str, str], credentials: Mapping[str, str]) -> dict[str, str]:
    """The headers that go upstream: the client's ``anthropic-*`` ones (version, beta) and ``credentials``."""
    headers = {k.lower(): v for k, v in client_headers.items() if k.lower().startswith("anthropic-")}
    return {**headers, "content-type": "application/json", **credentials}


# --- the proxy ---------------------------------------------------------------------------------

class AnthropicMessages:
    """``/v1/messages`` over the shared memory flow of ``proxy`` (module docstring)."""

    def __init__(self, proxy: MemoryProxy) -> None:
        self.proxy = proxy
        self.metrics = proxy.metrics

    def _url(self, path: str, query: str) -> str:
        base = self.proxy.settings.upstream_anthropic_base_url.rstrip("/")
        return f"{base}{path}" + (f"?{query}" if query else "")

    def _transport_error(self, exc: httpx.HTTPError) -> AnthropicProxyError:
        return as_anthropic_error(self.proxy.transport_error(exc))

    @staticmethod
    def _upstream_error(status_code: int, content: bytes, headers: httpx.Headers) -> ProxyAnswer:
        """The upstream's error: passed on as it came when it is Anthropic's shape, else said in that shape."""
        try:
            body = json.loads(content)
        except (UnicodeDecodeError, json.JSONDecodeError):
            body = None
        if isinstance(body, dict) and body.get("type") == "error" and isinstance(body.get("error"), dict):
            return ProxyAnswer(status_code, content, "application/json", passed_back_headers(headers))
        error = upstream_error(status_code, content)
        raise AnthropicProxyError(status_code, error.message, error_type=anthropic_error_type(status_code))

    async def passthrough(self, method: str, path: str, *, query: str, raw: bytes | None,
                          client_headers: Mapping[str, str], credentials: Mapping[str, str]) -> ProxyAnswer:
        """A call that needs no memory (``/v1/models``, ``/v1/messages/count_tokens``), passed through."""
        request = self.proxy.http().build_request(method, self._url(path, query), content=raw,
                                                  headers=forwarded_headers(client_headers, credentials))
        try:
            response = await self.proxy.http().send(request)
        except httpx.HTTPError as exc:
            raise self._transport_error(exc) from None
        if response.status_code >= 400:
            return self._upstream_error(response.status_code, response.content, response.headers)
        return ProxyAnswer(response.status_code, response.content,
                           response.headers.get("content-type", "application/json"),
                           passed_back_headers(response.headers))

    async def create(self, raw: bytes, *, query: str, client_headers: Mapping[str, str],
                     credentials: Mapping[str, str], key_user: str | None, actor: str,
                     read_only: bool = False) -> ProxyAnswer | ProxyStream:
        """One ``POST /v1/messages`` through the proxy; raises :class:`AnthropicProxyError` for the client.
        A ``read_only`` key is recalled for and answered; its turn is not stored and it forgets nothing."""
        request = parse_messages_request(raw, follow_up_words=self.proxy.settings.proxy_follow_up_words)
        metadata = request.body.get("metadata") or {}
        try:
            user_id = resolve_named_user(key_user, metadata.get("user_id"), field="metadata.user_id")
            forget = await self.proxy.forget_answer(user_id=user_id, actor=actor, read_only=read_only,
                                                    text=request.prompt_text if request.prompt_is_last else None)
        except ProxyError as exc:
            raise as_anthropic_error(exc) from None
        if forget is not None:
            self.metrics.count_proxy_request("forget", stream=request.stream)
            return yak_message(forget, body=request.body, stream=request.stream)
        block, recalled_ids = await self.proxy.recall_block(user_id, request.recall_texts)
        # Only ``system`` changes, and only when there is a block: otherwise the client's bytes go as they are.
        content = raw if not block else json.dumps(
            {**request.body, "system": with_memory_block(request.body.get("system"), block)}).encode("utf-8")
        upstream = self.proxy.http().build_request("POST", self._url(_MESSAGES_PATH, query), content=content,
                                                   headers=forwarded_headers(client_headers, credentials))
        store = self.proxy.turn_storer(request.prompt_text if request.storable else None, user_id=user_id,
                                       recalled_ids=recalled_ids, actor=actor, read_only=read_only)
        shown = {RECALLED_IDS_HEADER: ",".join(recalled_ids)}
        if request.stream:
            return await self._stream(upstream, store, shown)
        return await self._complete(upstream, store, shown)

    async def _complete(self, request: httpx.Request, store: TurnStore | None,
                        shown: Mapping[str, str]) -> ProxyAnswer:
        try:
            response = await self.proxy.http().send(request)
        except httpx.HTTPError as exc:
            self.metrics.count_proxy_request("upstream_error", stream=False)
            raise self._transport_error(exc) from None
        return await self._answered(response.status_code, response.content, response.headers, store, shown,
                                    stream=False)

    async def _answered(self, status_code: int, content: bytes, headers: httpx.Headers,
                        store: TurnStore | None, shown: Mapping[str, str], *,
                        stream: bool) -> ProxyAnswer:
        """A whole answer from upstream: errors passed on, the turn stored when it is finished, the body as it came."""
        if status_code >= 400:
            self.metrics.count_proxy_request("upstream_error", stream=stream)
            return self._upstream_error(status_code, content, headers)
        try:
            body = json.loads(content)
        except (UnicodeDecodeError, json.JSONDecodeError):
            body = None
        answer, is_message = answer_of_message(body)
        if not is_message:
            self.metrics.count_proxy_request("upstream_error", stream=stream)
            raise AnthropicProxyError(502, "the upstream model server answered with something that is not a message",
                                      error_type="api_error", code="upstream_garbage")
        if store is not None:
            await store(answer)
        self.metrics.count_proxy_request("answered", stream=stream)
        return ProxyAnswer(status_code, content, headers.get("content-type", "application/json"),
                           {**passed_back_headers(headers), **shown})

    async def _stream(self, request: httpx.Request, store: TurnStore | None,
                      shown: Mapping[str, str]) -> ProxyStream | ProxyAnswer:
        try:
            response = await self.proxy.http().send(request, stream=True)
        except httpx.HTTPError as exc:
            self.metrics.count_proxy_request("upstream_error", stream=True)
            raise self._transport_error(exc) from None
        if response.status_code >= 400 or "text/event-stream" not in response.headers.get("content-type", ""):
            # An error, or a server that ignores "stream": one body, passed on whole, never as events.
            content = await response.aread()
            await response.aclose()
            return await self._answered(response.status_code, content, response.headers, store, shown, stream=True)
        return ProxyStream(self._relay(response, store), response.headers.get("content-type", "text/event-stream"),
                           {**passed_back_headers(response.headers), **shown})

    async def _relay(self, response: httpx.Response,
                     store: TurnStore | None) -> AsyncIterator[bytes]:
        """The upstream's events as they come, unchanged; a finished answer goes to the turn writer before
        the chunk holding its ``message_stop`` is passed on (a client that read the whole stream finds its
        turn queued or stored). When the writer's queue is full the chat stores its turn itself, after
        every event, ``message_stop`` included, is passed on and before the response ends."""
        answer = StreamedMessage()
        outcome = "client_gone"  # until the loop ends: a client that hangs up stops the relay

        def hand_over_when_complete() -> None:
            if store is not None and answer.complete:
                store.hand_over(answer.answer)

        try:
            try:
                async for chunk in response.aiter_bytes():
                    answer.feed(chunk)
                    hand_over_when_complete()
                    yield chunk
            except httpx.HTTPError as exc:
                self.proxy.transport_error(exc)  # logs the failure (its type only)
                outcome = "upstream_cut"
                yield error_event("the upstream model server stopped in the middle of its answer; "
                                  "nothing was stored, please retry")
                return
            answer.feed(b"\n")
            if not answer.complete:
                outcome = "upstream_cut"
                if not answer.error:  # an error event the upstream sent has reached the client already
                    yield error_event("the upstream model server ended its answer without finishing it; "
                                      "nothing was stored, please retry")
                return
            outcome = "answered"
            hand_over_when_complete()
            if store is not None:
                await store.settle()
        finally:
            if store is not None:
                store.release()
            await response.aclose()
            if outcome == "upstream_cut":
                self.metrics.count_proxy_degradation("upstream_cut")
            self.metrics.count_proxy_request(outcome, stream=True)
