"""The memory proxy (issue 13): an OpenAI chat-completions endpoint that remembers.

Its memory flow (recall → block, forget in chat, the turn stored after the answer) is shared with
the Anthropic Messages endpoint, whose wire protocol is :mod:`yak_pipeline.services.proxy_anthropic`.

A client points its OpenAI base URL at Yak and its API key at a Yak key. For each chat:

1. the user is the one the key is scoped to (an admin key names one in the body's ``user``);
2. a forget command as the last user message (``/forget …``, DESIGN §4, or ``/forget confirm
   <token>``) is carried out by Yak (:mod:`yak_pipeline.services.forget`) and answered as the
   assistant; it never goes upstream, and it is never stored as a turn (that would store the
   very text being forgotten);
3. recall runs on the last user message (the one engine, :func:`services.recall.build_context`)
   and the block goes in as its own system message before that message
   (:func:`core.memory_block.insert_memory_block`); recall failing forwards the chat unchanged
   and counts a ``recall_failed`` degradation;
4. the chat goes upstream (``YAK_UPSTREAM_BASE_URL``, ``YAK_UPSTREAM_API_KEY``; never the
   client's Yak key) and the answer comes back byte for byte: the same body, or the same
   server-sent events with their finish reasons and usage;
5. a complete answer is stored exactly as ``POST /api/turns`` stores it
   (``store_exchange_turn``): the exchange becomes a memory, the turn is queued with the recalled
   ids for warmth. The store is handed to :class:`~yak_pipeline.services.turn_writer.TurnWriter`
   as the answer ends and runs after the response is sent, batched with the turns queued beside
   it: the client does not wait for it (unless the writer's queue is full: back-pressure, see
   there).

What is stored is a finished exchange or nothing ("nothing half-stored"): a stream that breaks
off (the upstream dies, or never sends a finish reason) stores no turn, because its truncated
answer would be distilled into facts the model never finished saying and its warmth judged
against half an answer; the client gets an error event instead of a silent end, retries, and the
retry's complete answer is stored. Chats Yak cannot store at full fidelity go through with their
memory block but store nothing: an answer with tool calls or without text, ``n`` > 1 choices,
a last user message with image or audio parts. Chats that do not end with a user message (a
tool result going back to the model) go through unchanged: they continue a turn already recalled for.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final, Protocol

import anyio.to_thread
import httpx

from yak_pipeline.core.conversation_query import recall_queries
from yak_pipeline.core.exchanges import turn_refusal
from yak_pipeline.core.forget import ForgetCommandError, parse_forget_command, parse_forget_confirmation
from yak_pipeline.core.memory_block import insert_memory_block
from yak_pipeline.core.types import InvalidUserId, validate_user_id
from yak_pipeline.embeddings import Embedder
from yak_pipeline.llm.errors import one_line
from yak_pipeline.services.exchange_embeddings import embed_exchanges_now
from yak_pipeline.services.forget import ForgetOutcome, confirm_forget, run_forget_command
from yak_pipeline.services.recall import block_choice, build_context, recall_params, relevance_model
from yak_pipeline.services.recall_judge import LLMRecallJudge
from yak_pipeline.services.turn_writer import TurnWriter
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline.store.errors import DatabaseUnavailable
from yak_pipeline.store.exchange_turns import store_exchange_turn

logger = logging.getLogger("yak.proxy")
# The injected memory blocks, logged only when asked for (YAK_PROXY_SHOW_BLOCK): they are private text.
block_logger = logging.getLogger("yak.proxy.block")

# Chats carry whole conversations and images as data URLs: more room than the API's 1 MiB.
PROXY_MAX_BODY_BYTES: Final = 16 * 1024 * 1024
# Where the API mounts the proxy: OpenAI clients append /chat/completions to a base URL ending in /v1.
PROXY_PREFIX: Final = "/v1"
# The response header naming the memories the proxy put into the prompt: ids, comma-separated
# (empty when none); a distillation's id, or an exchange's for the user's own words.
RECALLED_IDS_HEADER: Final = "X-Yak-Recalled-Ids"
_MAX_MESSAGE_CHARS: Final = 300
_CONNECT_TIMEOUT_SECONDS: Final = 10.0
# How long shutting down waits for turns answered but not yet stored (each store is bounded by the pool's timeout).
_SHUTDOWN_STORE_WAIT_SECONDS: Final = 60.0
_DONE_RE: Final = re.compile(rb"data:[ \t]*\[DONE\]")


class ProxyMetrics(Protocol):
    """What the proxy counts (the API's ``MetricsBuffer`` is one)."""

    def count_proxy_request(self, outcome: str, *, stream: bool) -> None: ...  # noqa: D102
    def count_injected_memories(self, count: int) -> None: ...  # noqa: D102
    def count_proxy_degradation(self, reason: str) -> None: ...  # noqa: D102
    def observe_recall(self, milliseconds: float) -> None: ...  # noqa: D102


class ProxyError(Exception):
    """A request the proxy answers with an error, in the OpenAI error shape (plus Yak's one-line ``detail``)."""

    def __init__(self, status_code: int, message: str, *, error_type: str = "invalid_request_error",
                 code: str | int | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = one_line(message, _MAX_MESSAGE_CHARS)
        self.error_type = error_type
        self.code = code
        self.param = param

    def body(self) -> dict[str, Any]:
        """``{"error": {message, type, param, code}, "detail": message}``: what OpenAI clients read, and Yak's line."""
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.code},
                "detail": self.message}


@dataclass(frozen=True)
class ProxyAnswer:
    """A whole answer: status, body bytes as they are sent, content type, and Yak's own headers."""

    status_code: int
    content: bytes
    media_type: str
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ProxyStream:
    """A streamed answer: the bytes to relay as they come, and their content type."""

    chunks: AsyncIterator[bytes]
    media_type: str = "text/event-stream"
    headers: Mapping[str, str] = field(default_factory=dict)


# --- reading the chat ------------------------------------------------------------------------

@dataclass(frozen=True)
class ChatRequest:
    """A chat-completions body, checked for what Yak itself reads; everything else passes through."""

    body: dict[str, Any]
    stream: bool
    # The last message's text when the chat ends with a user message, else None (nothing to recall for).
    user_text: str | None
    # The texts recall looks for when the chat ends with a user message (core.conversation_query).
    recall_texts: tuple[str, ...]
    # Whether a turn can be stored at full fidelity: text-only last user message, one choice.
    storable: bool


def _text_of(content: object) -> tuple[str | None, bool]:
    """A user message's text and whether that is all of it (image or audio parts are not text)."""
    if isinstance(content, str):
        return content, True
    if not isinstance(content, list):
        return None, False
    texts, text_only = [], True
    for part in content:
        if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            text_only = False
    return ("\n".join(texts) if texts else None), text_only


def _refuse_constant(name: str) -> float:
    # Python reads NaN and Infinity, JSON has neither: forwarded, they would break a strict upstream.
    raise ValueError(f"{name} is not a JSON number")


def parse_chat_request(raw: bytes, *, follow_up_words: int = 0) -> ChatRequest:
    """Check a chat-completions body as far as Yak reads it; raises :class:`ProxyError` (400) saying what is wrong."""
    try:
        body = json.loads(raw, parse_constant=_refuse_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProxyError(400, f"body: invalid JSON ({exc})") from None
    except ValueError as exc:
        raise ProxyError(400, f"body: invalid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise ProxyError(400, "body: must be a JSON object with 'model' and 'messages'")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ProxyError(400, "messages: must be a non-empty list of messages", param="messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ProxyError(400, f"messages[{index}]: each message must be an object with a 'role' string",
                             param=f"messages[{index}]")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise ProxyError(400, "stream: must be true or false", param="stream")
    last = messages[-1]
    text, text_only = _text_of(last.get("content")) if last["role"] == "user" else (None, False)
    choices = body.get("n")
    storable = text is not None and text_only and choices in (None, 1)
    recall_texts: list[str] = []
    if text is not None:
        earlier = [_text_of(m.get("content"))[0] for m in messages[:-1] if m["role"] == "user"]
        recall_texts = recall_queries([t for t in earlier if t is not None] + [text], follow_up_words=follow_up_words)
    return ChatRequest(body=body, stream=stream, user_text=text, recall_texts=tuple(recall_texts), storable=storable)


def resolve_user(key_user: str | None, body: Mapping[str, Any]) -> str:
    """Whose memories a chat uses: the key's user; for an admin key, the body's ``user`` (400 without one).

    A user-scoped key ignores ``user``: clients fill it with their own end-user ids, and a key
    must never reach another user's memories whatever the body says.
    """
    return resolve_named_user(key_user, body.get("user"), field="user")


def resolve_named_user(key_user: str | None, named: object, *, field: str) -> str:
    """The key's user, else (an admin key) the user the request's ``field`` names: 400 without a valid one.

    Both protocols' rule: OpenAI's ``user``, Anthropic's ``metadata.user_id``.
    """
    if key_user is not None:
        return key_user
    if named is None:
        raise ProxyError(400, f"{field}: an admin key must name the Yak user whose memories to use in the "
                              f"request's '{field}' field (or use a key scoped to that user)", param=field)
    try:
        return validate_user_id(named)
    except InvalidUserId as exc:
        raise ProxyError(400, f"{field}: {exc}", param=field) from None


# --- Yak's own answers (forget commands) -----------------------------------------------------

def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word.removesuffix('y') + 'ies' if word.endswith('y') else word + 's'}"


def describe_forget(outcome: ForgetOutcome) -> str:
    """What Yak answers in the chat after a forget command."""
    if outcome.action == "deleted":
        text = f"Forgotten: {_plural(len(outcome.deleted_memory_ids), 'memory')} and everything distilled from it " \
               f"({', '.join(outcome.deleted_memory_ids)})."
        if outcome.not_found:
            text += f" Not found: {', '.join(outcome.not_found)}."
        return text
    if outcome.action == "not_found":
        if outcome.not_found:
            return f"No memory {', '.join(outcome.not_found)} of yours was found; nothing was forgotten."
        return "That confirmation is unknown, used or expired; nothing was forgotten. Send the /forget command again."
    if outcome.action == "nothing":
        return "No memory contains that phrase; nothing was forgotten."
    lines = [f"{_plural(len(outcome.candidates), 'memory')} contain that phrase:"]
    for number, candidate in enumerate(outcome.candidates, 1):
        text = one_line(candidate["content"], _MAX_MESSAGE_CHARS)
        lines.append(f"{number}. [{candidate['occurred_at']:%Y-%m-%d}] {text}")
    lines.append(f"To forget them, send: /forget confirm {outcome.token}")
    lines.append("(within 10 minutes; anything else keeps them)")
    return "\n".join(lines)


def _completion_id() -> str:
    return f"chatcmpl-yak-{uuid.uuid4().hex}"


def yak_answer(text: str, *, body: Mapping[str, Any], stream: bool) -> ProxyAnswer | ProxyStream:
    """``text`` as the assistant's answer in the chat-completions protocol, streamed if asked."""
    model = body.get("model") if isinstance(body.get("model"), str) else "yak"
    common = {"id": _completion_id(), "created": int(time.time()), "model": model, "system_fingerprint": "yak"}
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    if not stream:
        completion = {**common, "object": "chat.completion", "usage": usage, "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop", "logprobs": None}]}
        return ProxyAnswer(200, json.dumps(completion).encode("utf-8"), "application/json")
    chunk = {**common, "object": "chat.completion.chunk"}
    events = [
        {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": None}]},
        {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    options = body.get("stream_options")
    if isinstance(options, Mapping) and options.get("include_usage"):
        events.append({**chunk, "choices": [], "usage": usage})

    async def relay() -> AsyncIterator[bytes]:
        for event in events:
            yield f"data: {json.dumps(event)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    return ProxyStream(relay())


# --- reading the upstream's answer -----------------------------------------------------------

@dataclass
class StreamedAnswer:
    """The answer carried by a stream of server-sent events, gathered as the bytes go by."""

    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    tool_calls: bool = False
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
            return
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        try:
            event = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError):
            self.error = True
            return
        if not isinstance(event, dict):
            return
        if event.get("error"):
            self.error = True
        for choice in event.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta, dict):
                if isinstance(delta.get("content"), str):
                    self.text.append(delta["content"])
                if delta.get("tool_calls") or delta.get("function_call"):
                    self.tool_calls = True
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])

    @property
    def complete(self) -> bool:
        """The stream said it finished (a finish reason) and carried no error."""
        return self.finish_reason is not None and not self.error


def answer_of_completion(body: object) -> tuple[str | None, bool]:
    """The first choice's text of a ``chat.completion`` body and whether the body is one at all."""
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
        return None, False
    choices = body["choices"]
    if not choices or not isinstance(choices[0], dict):
        return None, True
    message = choices[0].get("message") or {}
    if not isinstance(message, dict) or message.get("tool_calls") or message.get("function_call"):
        return None, True
    content = message.get("content")
    return (content if isinstance(content, str) and content else None), True


def upstream_error(status_code: int, content: bytes) -> ProxyError:
    """The upstream's error as the client gets it: the upstream's status, its message said clearly."""
    message, error_type, code = None, "upstream_error", status_code
    try:
        body = json.loads(content)
    except (UnicodeDecodeError, json.JSONDecodeError):
        body = None
    if isinstance(body, dict):
        error = body.get("error", body.get("detail"))
        if isinstance(error, dict):
            message = error.get("message")
            error_type = error.get("type") if isinstance(error.get("type"), str) else error_type
            code = error.get("code") if isinstance(error.get("code"), (str, int)) else code
        elif isinstance(error, str):
            message = error
    if not isinstance(message, str) or not message.strip():
        message = content.decode("utf-8", "replace").strip() or "no error message"
    return ProxyError(status_code, f"the upstream model server answered {status_code}: {message}",
                      error_type=error_type, code=code)


def _stream_error_event(message: str) -> bytes:
    """A server-sent event that makes OpenAI clients raise instead of ending quietly (how OpenAI reports mid-stream errors)."""
    error = {"error": {"message": message, "type": "upstream_error", "param": None, "code": "upstream_cut"}}
    return f"data: {json.dumps(error)}\n\n".encode()


# --- storing the turn --------------------------------------------------------------------------

@dataclass(frozen=True)
class PendingTurn:
    """A finished turn on its way to the database."""

    user_id: str
    user_text: str
    answer: str
    recalled_ids: list[str]
    actor: str
    occurred_at: datetime


class TurnStore:
    """One chat's turn, handed to the turn writer once its answer is known (both protocols).

    It is handed over at most once. A turn the writer's full queue hands back waits here: the chat
    stores it itself once the client has every byte (:meth:`settle`) or, the client gone before
    that, the writer takes it past the limit (:meth:`release`)."""

    def __init__(self, writer: TurnWriter[PendingTurn], *, user_id: str, user_text: str, recalled_ids: list[str],
                 actor: str) -> None:
        self._writer = writer
        self._user_id, self._user_text, self._recalled_ids, self._actor = user_id, user_text, recalled_ids, actor
        self._handed_over = False
        self._overflow: PendingTurn | None = None  # handed back by a full queue, not stored yet

    def hand_over(self, answer: str | None) -> None:
        """Queue the turn with ``answer`` for the writer (the first call only); when the writer's queue
        is full the turn stays here for :meth:`settle`."""
        if self._handed_over:
            return
        self._handed_over = True
        if not answer:
            return  # tool calls or an empty answer: no exchange to remember
        # The turn happened now, whenever the writer gets to it.
        turn = PendingTurn(user_id=self._user_id, user_text=self._user_text, answer=answer,
                           recalled_ids=self._recalled_ids, actor=self._actor, occurred_at=datetime.now(UTC))
        if not self._writer.submit(turn):
            self._overflow = turn

    async def settle(self) -> None:
        """Store the turn a full queue handed back, if any, in a worker thread: the chat's response ends after it."""
        turn, self._overflow = self._overflow, None
        if turn is not None:
            await anyio.to_thread.run_sync(self._writer.store_now, [turn])

    def release(self) -> None:
        """Queue a handed-back turn not stored yet past the limit: its client left before the chat could store it."""
        turn, self._overflow = self._overflow, None
        if turn is not None:
            self._writer.submit(turn, over_limit=True)

    async def __call__(self, answer: str | None) -> None:
        """Queue the turn, or (the queue full) store it before returning: for whole answers, whose
        body goes out only after this."""
        self.hand_over(answer)
        await self.settle()


# --- the proxy -------------------------------------------------------------------------------

class MemoryProxy:
    """The proxy's flow (module docstring) over the app's parts, given as getters so nothing is built before use."""

    def __init__(self, settings: Settings, *, database: Callable[[], Database], embedder: Callable[[], Embedder],
                 metrics: ProxyMetrics, judge: Callable[[], LLMRecallJudge | None] = lambda: None) -> None:
        self.settings = settings
        self._database = database
        self._embedder = embedder
        self._judge = judge
        self.metrics = metrics
        self._client: httpx.AsyncClient | None = None
        self._client_loop: object | None = None
        self.turns: TurnWriter[PendingTurn] = TurnWriter(self._store_turns)
        # Set once warm_documents_in_background has finished (loaded, or failed and logged).
        self.documents_warm = threading.Event()
        if settings.proxy_show_block and not block_logger.handlers:
            # Asked for on purpose (YAK_PROXY_SHOW_BLOCK, `yak proxy --show-block`): shown on stderr
            # whatever the process's logging is set to.
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(asctime)s yak proxy: %(message)s"))
            block_logger.addHandler(handler)
            block_logger.setLevel(logging.INFO)

    def warm_documents_in_background(self) -> threading.Thread:
        """Load the embedder's document model in a thread of its own (an embedder with a ``warm_up``:
        the local model), so the first turn stored does not wait for the load; the proxy serves
        chats and ``/health`` meanwhile. Sets :attr:`documents_warm` when done."""
        def warm() -> None:
            try:
                warm_up = getattr(self._embedder(), "warm_up", None)
                if warm_up is not None:
                    started = time.perf_counter()
                    warm_up()
                    logger.info("document model loaded in %.1f s", time.perf_counter() - started)
            except Exception as exc:  # noqa: BLE001 - the first stored turn loads it instead, and says so if it fails
                logger.warning("the document model was not loaded at start: %s", type(exc).__name__)
            finally:
                self.documents_warm.set()

        thread = threading.Thread(target=warm, name="yak-warm-documents", daemon=True)
        thread.start()
        return thread

    # -- upstream plumbing

    def _upstream(self) -> tuple[str, dict[str, str]]:
        base_url, key = self.settings.resolved_upstream
        if base_url is None:
            raise ProxyError(503, "the memory proxy has no upstream model server: set YAK_UPSTREAM_BASE_URL",
                             error_type="server_error", code="no_upstream")
        headers = {"Content-Type": "application/json"}
        if key is not None and key.get_secret_value():
            headers["Authorization"] = f"Bearer {key.get_secret_value()}"
        return base_url.rstrip("/"), headers

    def http(self) -> httpx.AsyncClient:
        """The pooled upstream client, shared by both protocols (``/v1/chat/completions``, ``/v1/messages``)."""
        # One pooled client per event loop: uvicorn has one; each test client runs its own.
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            timeout = httpx.Timeout(self.settings.upstream_timeout_seconds, connect=_CONNECT_TIMEOUT_SECONDS)
            self._client = httpx.AsyncClient(timeout=timeout, follow_redirects=False)
            self._client_loop = loop
        return self._client

    async def aclose(self) -> None:
        """Close the upstream connections and wait for the turns not yet stored (at shutdown)."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if not await anyio.to_thread.run_sync(self.turns.wait, _SHUTDOWN_STORE_WAIT_SECONDS):
            logger.warning("%d proxied turns were still being stored at shutdown", self.turns.waiting)

    @staticmethod
    def transport_error(exc: httpx.HTTPError) -> ProxyError:
        """A failed upstream call as the client's error: 504 on a timeout, else 502."""
        # Only the error's type: its text can carry the upstream URL, which may hold credentials.
        logger.warning("upstream model server failed: %s", type(exc).__name__)
        if isinstance(exc, httpx.TimeoutException):
            return ProxyError(504, "the upstream model server did not answer in time", error_type="upstream_error",
                              code="upstream_timeout")
        return ProxyError(502, f"could not reach the upstream model server ({type(exc).__name__})",
                          error_type="upstream_error", code="upstream_unreachable")

    async def list_models(self) -> ProxyAnswer:
        """``GET /models`` of the upstream, passed through (its errors mapped like a chat's)."""
        base_url, headers = self._upstream()
        try:
            response = await self.http().get(f"{base_url}/models", headers=headers)
        except httpx.HTTPError as exc:
            raise self.transport_error(exc) from None
        if response.status_code >= 400:
            raise upstream_error(response.status_code, response.content)
        return ProxyAnswer(response.status_code, response.content,
                           response.headers.get("content-type", "application/json"))

    # -- memory

    def _recall(self, user_id: str, queries: Sequence[str]) -> tuple[str, list[str]]:
        """The block and recalled ids for ``queries`` (``recall_queries``: the last message first);
        ``("", [])`` and a counted degradation when recall fails."""
        started = time.perf_counter()
        try:
            database, embedder = self._database(), self._embedder()
            params = recall_params(self.settings, threshold=self.settings.proxy_recall_threshold,
                                   limit=self.settings.proxy_recall_limit)
            block, built = build_context(database, embedder, user_id=user_id, query=queries[0], also=queries[1:],
                                         params=params, model=relevance_model(self.settings, embedder),
                                         judge=self._judge(), choice=block_choice(self.settings))
            error = built.recall_error
        except Exception as exc:  # noqa: BLE001 - no memories is better than no answer
            block, built, error = "", None, f"{type(exc).__name__}: {one_line(exc, _MAX_MESSAGE_CHARS)}"
        if error is not None or built is None:
            self.metrics.count_proxy_degradation("recall_failed")
            logger.warning("recall failed; the chat goes upstream without memories: %s", error)
            return "", []
        self.metrics.observe_recall((time.perf_counter() - started) * 1000)
        self.metrics.count_injected_memories(len(built.recalled_ids))
        return block, built.recalled_ids

    def _store_turns(self, turns: Sequence[PendingTurn]) -> int:
        """Store finished turns as ``POST /api/turns`` does, each on its own (one that would be refused,
        too long or with NUL characters, or whose write fails is counted and logged, and the others
        are stored), then give the new exchanges their vectors in one model call per kind; how many turns
        ``store_exchange_turn`` took (one whose exchange was stored before included)."""
        created: list[str] = []
        stored = 0
        for turn in turns:
            memory_id = self._write_turn(turn)
            if memory_id is not None:
                stored += 1
                if memory_id:
                    created.append(memory_id)
        if created:
            # Recallable by meaning at the next turn, not only after the pipeline has run; this runs
            # after the answers have gone out (the turn writer), never in a chat's way. All the
            # batch's exchanges in one go: one model call per kind, not two per turn. A failing
            # embedder only logs; the pipeline embeds them later.
            try:
                embed_exchanges_now(self._database(), self._embedder(), created)
            except Exception as exc:  # noqa: BLE001 - the turns stand; the pipeline embeds them later
                logger.warning("%d proxied turns were stored without vectors: %s", len(created), type(exc).__name__)
        return stored

    def _write_turn(self, turn: PendingTurn) -> str | None:
        """Write one turn in its own transaction: the new exchange's id, ``""`` when it was stored
        already (the same exchange again), None (counted, logged) when it was refused or failed."""
        refusal = turn_refusal(turn.user_text, turn.answer)
        if refusal is not None:
            self.metrics.count_proxy_degradation("turn_not_stored")
            logger.warning("the proxied turn of %s was not stored: %s", turn.user_id, refusal)
            return None
        try:
            database = self._database()
            with database.connection() as conn:
                stored = store_exchange_turn(conn, user_id=turn.user_id, user_message=turn.user_text,
                                             assistant_message=turn.answer, recalled_ids=turn.recalled_ids,
                                             occurred_at=turn.occurred_at, actor=turn.actor,
                                             secrets=database.secrets)
        except Exception as exc:  # noqa: BLE001 - the client has its answer already; the turn is lost, said so
            self.metrics.count_proxy_degradation("turn_not_stored")
            logger.warning("the proxied turn of %s was not stored: %s", turn.user_id, type(exc).__name__)
            return None
        return str(stored.memory_id) if stored.created else ""

    def _forget(self, *, user_id: str, text: str, actor: str) -> str | None:
        """Yak's answer to a forget command in ``text``, or None when ``text`` is not one."""
        token = parse_forget_confirmation(text)
        try:
            if token is not None:
                outcome = confirm_forget(self._database(), user_id=user_id, token=token, actor=actor)
            else:
                if parse_forget_command(text) is None:
                    return None
                outcome = run_forget_command(self._database(), user_id=user_id, command=text, actor=actor)
        except ForgetCommandError as exc:
            return f"Nothing was forgotten: {one_line(exc, _MAX_MESSAGE_CHARS)}"
        except DatabaseUnavailable:
            raise ProxyError(503, "the database is unavailable; nothing was forgotten, try again shortly",
                             error_type="server_error", code="database_unavailable") from None
        return describe_forget(outcome)

    @staticmethod
    def _looks_like_forget(text: str) -> bool:
        try:
            return parse_forget_confirmation(text) is not None or parse_forget_command(text) is not None
        except ForgetCommandError:
            return True  # meant as a command: Yak explains what is wrong, nothing goes upstream

    # -- the memory flow both protocols share (recall → block, forget in chat, store the turn)

    async def recall_block(self, user_id: str, recall_texts: Sequence[str]) -> tuple[str, list[str]]:
        """The memory block and recalled ids for a chat's ``recall_texts`` (``("", [])`` when there is
        nothing to recall for, recall is switched off, or it fails), logged when asked for."""
        if not recall_texts or self.settings.proxy_recall_limit <= 0:
            return "", []
        block, recalled_ids = await anyio.to_thread.run_sync(self._recall, user_id, recall_texts)
        if block and self.settings.proxy_show_block:
            block_logger.info("memory block for %s (%d memories):\n%s", user_id, len(recalled_ids), block)
        return block, recalled_ids

    async def forget_answer(self, *, user_id: str, text: str | None, actor: str, read_only: bool = False) -> str | None:
        """Yak's answer when ``text`` (the last user message) is a forget command, carried out (with a
        ``read_only`` key: refused, nothing forgotten); else None."""
        if text is None or not self._looks_like_forget(text):
            return None
        if read_only:
            return "Nothing was forgotten: this API key is read-only."
        answer = await anyio.to_thread.run_sync(lambda: self._forget(user_id=user_id, text=text, actor=actor))
        return answer or ""

    # -- the chat

    async def chat_completions(self, raw: bytes, *, key_user: str | None, actor: str,
                               read_only: bool = False) -> ProxyAnswer | ProxyStream:
        """One chat completion through the proxy (module docstring); raises :class:`ProxyError` for the client.

        With a ``read_only`` key the chat is recalled for and answered, but its turn is not stored
        and a forget command forgets nothing."""
        chat = parse_chat_request(raw, follow_up_words=self.settings.proxy_follow_up_words)
        user_id = resolve_user(key_user, chat.body)
        text = await self.forget_answer(user_id=user_id, text=chat.user_text, actor=actor, read_only=read_only)
        if text is not None:
            self.metrics.count_proxy_request("forget", stream=chat.stream)
            return yak_answer(text, body=chat.body, stream=chat.stream)
        base_url, headers = self._upstream()
        block, recalled_ids = await self.recall_block(user_id, chat.recall_texts)
        # Only the messages change; every other field goes upstream as the client sent it.
        forwarded = {**chat.body, "messages": insert_memory_block(chat.body["messages"], block)}
        request = self.http().build_request("POST", f"{base_url}/chat/completions", headers=headers,
                                            content=json.dumps(forwarded).encode("utf-8"))
        store = self.turn_storer(chat.user_text if chat.storable else None, user_id=user_id,
                                 recalled_ids=recalled_ids, actor=actor, read_only=read_only)
        # Which memories went into the prompt, for the client to show or log (the ids only, never text).
        shown = {RECALLED_IDS_HEADER: ",".join(recalled_ids)}
        if chat.stream:
            return replace(await self._stream(request, store), headers=shown)
        return replace(await self._complete(request, store), headers=shown)

    def turn_storer(self, user_text: str | None, *, user_id: str, recalled_ids: list[str],
                    actor: str, read_only: bool = False) -> TurnStore | None:
        """What stores the turn once its answer is known (None when ``user_text`` is None: nothing to store,
        or the key is ``read_only``: it is answered, never stored); the store itself runs on the turn
        writer, after the response."""
        if user_text is None or read_only:
            return None
        return TurnStore(self.turns, user_id=user_id, user_text=user_text, recalled_ids=recalled_ids, actor=actor)

    async def _complete(self, request: httpx.Request, store: TurnStore | None) -> ProxyAnswer:
        try:
            response = await self.http().send(request)
        except httpx.HTTPError as exc:
            self.metrics.count_proxy_request("upstream_error", stream=False)
            raise self.transport_error(exc) from None
        if response.status_code >= 400:
            self.metrics.count_proxy_request("upstream_error", stream=False)
            raise upstream_error(response.status_code, response.content)
        return await self._answered(response.status_code, response.content, response.headers, store, stream=False)

    async def _answered(self, status_code: int, content: bytes, headers: httpx.Headers,
                        store: TurnStore | None, *, stream: bool) -> ProxyAnswer:
        """A whole chat completion from upstream: the turn stored (when it can be), the body passed on as it came."""
        try:
            body = json.loads(content)
        except (UnicodeDecodeError, json.JSONDecodeError):
            body = None
        answer, is_completion = answer_of_completion(body)
        if not is_completion:
            self.metrics.count_proxy_request("upstream_error", stream=stream)
            raise ProxyError(502, "the upstream model server answered with something that is not a chat completion",
                             error_type="upstream_error", code="upstream_garbage")
        if store is not None:
            await store(answer)
        self.metrics.count_proxy_request("answered", stream=stream)
        return ProxyAnswer(status_code, content, headers.get("content-type", "application/json"))

    async def _stream(self, request: httpx.Request,
                      store: TurnStore | None) -> ProxyStream | ProxyAnswer:
        try:
            response = await self.http().send(request, stream=True)
        except httpx.HTTPError as exc:
            self.metrics.count_proxy_request("upstream_error", stream=True)
            raise self.transport_error(exc) from None
        if response.status_code >= 400:
            content = await response.aread()
            await response.aclose()
            self.metrics.count_proxy_request("upstream_error", stream=True)
            raise upstream_error(response.status_code, content)
        if "text/event-stream" not in response.headers.get("content-type", ""):
            # A server that ignores "stream" answers one body; it is passed on whole, never as events.
            content = await response.aread()
            await response.aclose()
            return await self._answered(response.status_code, content, response.headers, store, stream=True)
        return ProxyStream(self._relay(response, store),
                           response.headers.get("content-type", "text/event-stream"))

    async def _relay(self, response: httpx.Response, store: TurnStore | None) -> AsyncIterator[bytes]:
        """The upstream's bytes as they come; the turn goes to the writer once the stream finished,
        before its ``[DONE]`` is passed on, so a client that has read the whole stream finds its turn
        queued or stored (``turns.wait()`` sees it). When the writer's queue is full the chat stores
        its turn itself, after the last byte is passed on and before the response ends."""
        answer = StreamedAnswer()
        outcome = "client_gone"  # until the loop below ends: a client that hangs up stops the relay

        def hand_over_when_complete() -> None:
            if store is not None and answer.complete and not answer.tool_calls:
                store.hand_over("".join(answer.text))

        try:
            try:
                async for chunk in response.aiter_bytes():
                    done = _DONE_RE.search(chunk)
                    if done is None:
                        answer.feed(chunk)
                        yield chunk
                        continue
                    head, tail = chunk[: done.start()], chunk[done.start():]
                    answer.feed(head)
                    if head:
                        yield head
                    hand_over_when_complete()
                    answer.feed(tail)
                    yield tail
            except httpx.HTTPError as exc:
                logger.warning("the upstream stream broke off: %s", type(exc).__name__)
                outcome = "upstream_cut"
                yield _stream_error_event("the upstream model server stopped in the middle of its answer; "
                                          "nothing was stored, please retry")
                return
            answer.feed(b"\n")
            if not answer.complete:
                outcome = "upstream_cut"
                yield _stream_error_event("the upstream model server ended its answer without finishing it; "
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
