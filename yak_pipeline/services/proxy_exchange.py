"""The memory proxy's exchange with the upstream model server, written once for every wire protocol.

A chat (:class:`ProxiedChat`: OpenAI's chat completions in :mod:`yak_pipeline.api.proxy_openai`,
Anthropic's Messages in :mod:`yak_pipeline.api.proxy_anthropic`) says how its protocol reads an
answer and says an error; this module sends it upstream and brings the answer back unchanged:

- a whole answer: the upstream's errors passed on in the protocol's terms, a body that is no answer
  a 502, a finished answer's turn handed to the turn writer before the body goes out;
- a stream: every byte relayed as it comes; the finished answer's turn handed over before the bytes
  that end the stream are passed on (so a client that has read it all finds its turn queued or
  stored); a stream that breaks off, or ends without finishing, stores nothing and ends in the
  protocol's error event ("nothing half-stored"); a client that hangs up stops the relay.

Each chat is counted once in ``yak_proxy_requests_total`` by how it ended, before its response ends.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import httpx

from yak_pipeline.llm.errors import one_line
from yak_pipeline.services.turn_writer import TurnStore

logger = logging.getLogger("yak.proxy")

MAX_MESSAGE_CHARS: Final = 300
_BROKE_OFF: Final = "the upstream model server stopped in the middle of its answer; nothing was stored, please retry"
_UNFINISHED: Final = "the upstream model server ended its answer without finishing it; nothing was stored, please retry"


class ProxyMetrics(Protocol):
    """What the proxy counts (the API's ``MetricsBuffer`` is one)."""

    def count_proxy_request(self, outcome: str, *, stream: bool) -> None: ...  # noqa: D102
    def count_injected_memories(self, count: int) -> None: ...  # noqa: D102
    def count_proxy_degradation(self, reason: str) -> None: ...  # noqa: D102
    def observe_recall(self, milliseconds: float) -> None: ...  # noqa: D102


class ProxyError(Exception):
    """A request the proxy answers with an error: its status, one line, and OpenAI's error fields.

    Its :meth:`body` is OpenAI's error shape, which every ``/v1`` error answers in but those of
    ``/v1/messages``: there :class:`~yak_pipeline.api.proxy_anthropic.AnthropicProxyError` says it
    in Anthropic's."""

    def __init__(self, status_code: int, message: str, *, error_type: str = "invalid_request_error",
                 code: str | int | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = one_line(message, MAX_MESSAGE_CHARS)
        self.error_type = error_type
        self.code = code
        self.param = param

    def body(self) -> dict[str, Any]:
        """``{"error": {message, type, param, code}, "detail": message}``: what OpenAI clients read, and Yak's line."""
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.code},
                "detail": self.message}


@dataclass(frozen=True)
class ProxyAnswer:
    """A whole answer: status, body bytes as they are sent, content type, the upstream's headers passed
    back, and the ids of the memories put into the prompt (None: no chat went upstream)."""

    status_code: int
    content: bytes
    media_type: str
    headers: Mapping[str, str] = field(default_factory=dict)
    recalled_ids: Sequence[str] | None = None


@dataclass(frozen=True)
class ProxyStream:
    """A streamed answer: the bytes to relay as they come, their content type, headers and recalled ids."""

    chunks: AsyncIterator[bytes]
    media_type: str = "text/event-stream"
    headers: Mapping[str, str] = field(default_factory=dict)
    recalled_ids: Sequence[str] | None = None


@dataclass
class EventLines:
    """Server-sent events read as the bytes go by: each complete line to :meth:`read_line` (a partial
    line waits for the next chunk). The protocols' stream readers build on it."""

    _pending: bytes = b""

    def feed(self, chunk: bytes) -> None:
        """Read the complete lines of ``chunk``."""
        self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        for line in lines:
            self.read_line(line.strip())

    def read_line(self, line: bytes) -> None:
        """Take in one line (stripped); the protocol's reader says what it means."""
        raise NotImplementedError


class AnswerStream(Protocol):
    """A protocol's stream of server-sent events, read as it is relayed."""

    def feed(self, chunk: bytes) -> None:
        """Read ``chunk``'s complete lines."""

    def hand_over_at(self, chunk: bytes) -> int | None:
        """Where in ``chunk`` the bytes begin that go out only after a finished answer's turn is handed
        over (None: nowhere in this chunk)."""

    def cut_event(self, message: str) -> bytes:
        """The event that makes the protocol's clients raise ``message`` instead of ending quietly."""

    @property
    def complete(self) -> bool:
        """The stream said it finished, and carried no error."""

    @property
    def answer(self) -> str | None:
        """The text to store as the turn's answer (None: nothing to store)."""

    @property
    def error_relayed(self) -> bool:
        """An error event of the upstream's that the client reads as one has been passed on already."""


@dataclass(frozen=True)
class ChatTurn:
    """What the memory flow reads of a chat, whatever its protocol (each protocol's parser makes one)."""

    stream: bool  # the client asked for a stream
    forget_text: str | None  # the user's last message when it may be a forget command for Yak
    recall_texts: Sequence[str]  # what recall looks for (the last message first); empty: nothing
    turn_text: str | None  # the user's words to store with the answer; None: not storable at full fidelity


class ProxiedChat(Protocol):
    """One chat as its wire protocol carries it: what the memory flow asks of it."""

    @property
    def user_id(self) -> str:
        """Whose memories the chat uses."""

    @property
    def turn(self) -> ChatTurn:
        """What the memory flow reads of the chat."""

    def yak_answer(self, text: str) -> ProxyAnswer | ProxyStream:
        """``text`` as the assistant's answer (Yak's own, to a forget command), streamed if asked."""

    def upstream(self) -> tuple[str, Mapping[str, str]]:
        """The URL the chat goes to and the headers it carries; raises :class:`ProxyError` when there is none."""

    def forwarded(self, block: str) -> bytes:
        """The body that goes upstream, with the memory ``block`` (maybe empty) where the protocol puts it."""

    def answer_stream(self) -> AnswerStream:
        """A reader for a streamed answer."""

    def answer_of(self, body: object) -> tuple[str | None, bool]:
        """A whole answer's text to store (None: none), and whether ``body`` is an answer at all."""

    def refused(self, status_code: int, content: bytes, headers: httpx.Headers) -> ProxyAnswer:
        """The upstream's error answer as the client gets it: passed on, or raised as a :class:`ProxyError`."""

    def not_an_answer(self) -> ProxyError:
        """The 502 for an upstream body that is not an answer in this protocol."""

    def passed_back(self, headers: httpx.Headers) -> dict[str, str]:
        """The upstream's response headers the client gets back."""


def upstream_error(status_code: int, content: bytes) -> ProxyError:
    """The upstream's error as the client gets it: the upstream's status, its message said clearly."""
    message: object = None
    error_type = "upstream_error"
    code: str | int = status_code
    try:
        body = json.loads(content)
    except (UnicodeDecodeError, json.JSONDecodeError):
        body = None
    if isinstance(body, dict):
        error = body.get("error", body.get("detail"))
        if isinstance(error, dict):
            message = error.get("message")
            if isinstance(given_type := error.get("type"), str):
                error_type = given_type
            if isinstance(given_code := error.get("code"), (str, int)):
                code = given_code
        elif isinstance(error, str):
            message = error
    if not isinstance(message, str) or not message.strip():
        message = content.decode("utf-8", "replace").strip() or "no error message"
    return ProxyError(status_code, f"the upstream model server answered {status_code}: {message}",
                      error_type=error_type, code=code)


def transport_error(exc: httpx.HTTPError) -> ProxyError:
    """A failed upstream call as the client's error: 504 on a timeout, else 502."""
    # Only the error's type: its text can carry the upstream URL, which may hold credentials.
    logger.warning("upstream model server failed: %s", type(exc).__name__)
    if isinstance(exc, httpx.TimeoutException):
        return ProxyError(504, "the upstream model server did not answer in time", error_type="upstream_error",
                          code="upstream_timeout")
    return ProxyError(502, f"could not reach the upstream model server ({type(exc).__name__})",
                      error_type="upstream_error", code="upstream_unreachable")


class UpstreamExchange:
    """One chat's request upstream and its answer back (module docstring)."""

    def __init__(self, http: httpx.AsyncClient, metrics: ProxyMetrics, chat: ProxiedChat, store: TurnStore | None,
                 recalled_ids: Sequence[str]) -> None:
        self._http, self._metrics, self._chat, self._store = http, metrics, chat, store
        self._recalled_ids = recalled_ids

    async def send(self, request: httpx.Request) -> ProxyAnswer | ProxyStream:
        """Send ``request``; the answer whole, or streamed when the chat asked for a stream."""
        stream = self._chat.turn.stream
        try:
            response = await self._http.send(request, stream=stream)
        except httpx.HTTPError as exc:
            self._metrics.count_proxy_request("upstream_error", stream=stream)
            raise transport_error(exc) from None
        if not stream:
            return await self._answered(response.status_code, response.content, response.headers, stream=False)
        if response.status_code >= 400 or "text/event-stream" not in response.headers.get("content-type", ""):
            # An error, or a server that ignores "stream": one body, passed on whole, never as events.
            content = await response.aread()
            await response.aclose()
            return await self._answered(response.status_code, content, response.headers, stream=True)
        return ProxyStream(self._relay(response), response.headers.get("content-type", "text/event-stream"),
                           self._chat.passed_back(response.headers), self._recalled_ids)

    async def _answered(self, status_code: int, content: bytes, headers: httpx.Headers, *,
                        stream: bool) -> ProxyAnswer:
        """A whole answer from upstream: errors passed on, the turn stored when it can be, the body as it came."""
        if status_code >= 400:
            self._metrics.count_proxy_request("upstream_error", stream=stream)
            return self._chat.refused(status_code, content, headers)
        try:
            body = json.loads(content)
        except (UnicodeDecodeError, json.JSONDecodeError):
            body = None
        answer, is_answer = self._chat.answer_of(body)
        if not is_answer:
            self._metrics.count_proxy_request("upstream_error", stream=stream)
            raise self._chat.not_an_answer()
        if self._store is not None:
            await self._store(answer)
        self._metrics.count_proxy_request("answered", stream=stream)
        return ProxyAnswer(status_code, content, headers.get("content-type", "application/json"),
                           self._chat.passed_back(headers), self._recalled_ids)

    async def _relay(self, response: httpx.Response) -> AsyncIterator[bytes]:
        """The upstream's bytes as they come. A finished answer goes to the turn writer before the bytes
        that end the stream are passed on (OpenAI's ``[DONE]``, the chunk holding Anthropic's
        ``message_stop``). When the writer's queue is full the chat stores its turn itself, after the
        last byte is passed on and before the response ends."""
        answer, store = self._chat.answer_stream(), self._store
        outcome = "client_gone"  # until the loop below ends: a client that hangs up stops the relay

        def hand_over_when_complete() -> None:
            if store is not None and answer.complete:
                store.hand_over(answer.answer)

        try:
            try:
                async for chunk in response.aiter_bytes():
                    at = answer.hand_over_at(chunk)
                    if at is None:
                        answer.feed(chunk)
                        yield chunk
                        continue
                    head, tail = chunk[:at], chunk[at:]
                    answer.feed(head)
                    hand_over_when_complete()
                    if head:
                        yield head
                    if tail:
                        answer.feed(tail)
                        yield tail
            except httpx.HTTPError as exc:
                logger.warning("the upstream stream broke off: %s", type(exc).__name__)
                outcome = "upstream_cut"
                yield answer.cut_event(_BROKE_OFF)
                return
            answer.feed(b"\n")
            if not answer.complete:
                outcome = "upstream_cut"
                if not answer.error_relayed:
                    yield answer.cut_event(_UNFINISHED)
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
                self._metrics.count_proxy_degradation("upstream_cut")
            self._metrics.count_proxy_request(outcome, stream=True)
