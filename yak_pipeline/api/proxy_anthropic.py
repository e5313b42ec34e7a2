"""The memory proxy in Anthropic's Messages API (issue 34): ``POST /v1/messages`` for Claude Code and every
Anthropic client, beside the OpenAI protocol of :mod:`yak_pipeline.api.proxy_openai` on the same port.

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
from uuid import uuid4

import httpx

from yak_pipeline.core.conversation_query import recall_queries
from yak_pipeline.ingestion.formats.claude_code_sessions import without_client_meta
from yak_pipeline.services.proxy import MemoryProxy, resolve_named_user
from yak_pipeline.services.proxy_exchange import (
    ChatTurn,
    EventLines,
    ProxyAnswer,
    ProxyError,
    ProxyStream,
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


def parse_messages_request(raw: bytes, *, follow_up_words: int = 0) -> tuple[dict[str, Any], ChatTurn]:
    """A Messages body, checked as far as Yak reads it (everything else passes through as sent), and what
    the memory flow reads of it: what the person typed in this turn's prompt, recalled for; forgotten
    by when the prompt itself is the last message (not a tool result going back); stored when the
    prompt is text only (no images or documents) and the last message is the user's. Raises
    :class:`AnthropicProxyError` (400) saying what is wrong."""
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
    prompt = next(((text, only, i) for (text, only, _), i in reversed(typed) if text is not None), None)
    last_is_user = messages[-1]["role"] == "user"
    if prompt is None or not last_is_user:
        # No prompt, or an assistant prefill to continue: pass through, nothing recalled or stored.
        return body, ChatTurn(stream=stream, forget_text=None, recall_texts=(), turn_text=None)
    text, text_only, index = prompt
    earlier = [t[0] for t, i in typed if i < index and t[0] is not None]
    recall_texts = recall_queries([*earlier, text], follow_up_words=follow_up_words)
    return body, ChatTurn(stream=stream, forget_text=text if index == len(messages) - 1 else None,
                          recall_texts=tuple(recall_texts), turn_text=text if text_only else None)


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
class StreamedMessage(EventLines):
    """The answer carried by a Messages event stream, gathered as the bytes go by."""

    text: list[str] = field(default_factory=list)
    stop_reason: str | None = None
    tool_use: bool = False
    stopped: bool = False  # message_stop seen
    error: bool = False

    def read_line(self, line: bytes) -> None:
        """Take in one ``data:`` line: text deltas, tool use, the stop reason, the stop, or an error."""
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

    @staticmethod
    def hand_over_at(chunk: bytes) -> int:
        """The end of every chunk: the one holding ``message_stop`` goes out after the turn is handed over."""
        return len(chunk)

    @staticmethod
    def cut_event(message: str) -> bytes:
        """An ``error`` event: how Anthropic reports a stream failing midway (the SDKs raise it)."""
        return error_event(message)

    @property
    def error_relayed(self) -> bool:
        """An ``error`` event the upstream sent has reached the client already."""
        return self.error

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




def messages_url(proxy: MemoryProxy, path: str, query: str) -> str:
    """``path`` (and the client's ``query``) under the Anthropic upstream's base URL."""
    base = proxy.settings.upstream_anthropic_base_url.rstrip("/")
    return f"{base}{path}" + (f"?{query}" if query else "")


def _refused(status_code: int, content: bytes, headers: httpx.Headers) -> ProxyAnswer:
    """The upstream's error: passed on as it came when it is Anthropic's shape, else said in that shape."""
    try:
        body = json.loads(content)
    except (UnicodeDecodeError, json.JSONDecodeError):
        body = None
    if isinstance(body, dict) and body.get("type") == "error" and isinstance(body.get("error"), dict):
        return ProxyAnswer(status_code, content, "application/json", passed_back_headers(headers))
    error = upstream_error(status_code, content)
    raise AnthropicProxyError(status_code, error.message, error_type=anthropic_error_type(status_code))


# --- the message through the memory flow -------------------------------------------------------

@dataclass(frozen=True)
class MessagesChat:
    """A ``POST /v1/messages`` as the memory flow carries it
    (:class:`~yak_pipeline.services.proxy_exchange.ProxiedChat`)."""

    body: dict[str, Any]
    user_id: str
    turn: ChatTurn
    raw: bytes  # the body as the client sent it: it goes upstream as it is when there is no block
    url: str
    headers: Mapping[str, str]

    def yak_answer(self, text: str) -> ProxyAnswer | ProxyStream:
        """Yak's ``text`` as a message."""
        return yak_message(text, body=self.body, stream=self.turn.stream)

    def upstream(self) -> tuple[str, Mapping[str, str]]:
        """``/v1/messages`` of the Anthropic upstream, with the client's ``anthropic-*`` headers and the credentials."""
        return self.url, self.headers

    def forwarded(self, block: str) -> bytes:
        """Only ``system`` changes, and only when there is a block: otherwise the client's bytes go as they are."""
        if not block:
            return self.raw
        return json.dumps({**self.body, "system": with_memory_block(self.body.get("system"), block)}).encode("utf-8")

    def answer_stream(self) -> StreamedMessage:
        """A reader of Messages events."""
        return StreamedMessage()

    def answer_of(self, body: object) -> tuple[str | None, bool]:
        """The message's text (:func:`answer_of_message`)."""
        return answer_of_message(body)

    def refused(self, status_code: int, content: bytes, headers: httpx.Headers) -> ProxyAnswer:
        """Passed on as it came when it is Anthropic's shape, else said in that shape."""
        return _refused(status_code, content, headers)

    def not_an_answer(self) -> ProxyError:
        """502: the body is not a message."""
        return AnthropicProxyError(502, "the upstream model server answered with something that is not a message",
                                   error_type="api_error", code="upstream_garbage")

    def passed_back(self, headers: httpx.Headers) -> dict[str, str]:
        """Request ids, rate limits, retry advice."""
        return passed_back_headers(headers)


async def create_message(proxy: MemoryProxy, raw: bytes, *, query: str, client_headers: Mapping[str, str],
                         credentials: Mapping[str, str], key_user: str | None, actor: str,
                         read_only: bool = False) -> ProxyAnswer | ProxyStream:
    """One ``POST /v1/messages`` through the proxy; raises :class:`AnthropicProxyError` for the client.
    A ``read_only`` key is recalled for and answered; its turn is not stored and it forgets nothing."""
    body, turn = parse_messages_request(raw, follow_up_words=proxy.settings.proxy_follow_up_words)
    metadata = body.get("metadata") or {}
    try:
        user_id = resolve_named_user(key_user, metadata.get("user_id"), field="metadata.user_id")
        chat = MessagesChat(body, user_id, turn, raw, messages_url(proxy, _MESSAGES_PATH, query),
                            forwarded_headers(client_headers, credentials))
        return await proxy.converse(chat, actor=actor, read_only=read_only)
    except ProxyError as exc:
        # The shared flow says its errors in OpenAI's terms: the client reads Anthropic's.
        raise as_anthropic_error(exc) from None


async def pass_through(proxy: MemoryProxy, method: str, path: str, *, query: str, raw: bytes | None,
                       client_headers: Mapping[str, str], credentials: Mapping[str, str]) -> ProxyAnswer:
    """A call that needs no memory (``/v1/models``, ``/v1/messages/count_tokens``), passed through."""
    try:
        response = await proxy.pass_through(method, messages_url(proxy, path, query), content=raw,
                                            headers=forwarded_headers(client_headers, credentials))
    except ProxyError as exc:
        raise as_anthropic_error(exc) from None
    if response.status_code >= 400:
        return _refused(response.status_code, response.content, response.headers)
    return ProxyAnswer(response.status_code, response.content, response.headers.get("content-type", "application/json"),
                       passed_back_headers(response.headers))
