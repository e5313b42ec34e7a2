"""The memory proxy's flow (issues 13 and 34): recall → block → upstream → store, whatever the protocol.

The wire protocols are the API's: OpenAI's chat completions (:mod:`yak_pipeline.api.proxy_openai`)
and Anthropic's Messages (:mod:`yak_pipeline.api.proxy_anthropic`) each read a chat into a
:class:`~yak_pipeline.services.proxy_exchange.ProxiedChat`, and :meth:`MemoryProxy.converse` carries it:

1. the user is the one the key is scoped to (an admin key names one in the request,
   :func:`resolve_named_user`);
2. a forget command as the user's last message (``/forget …``, DESIGN §4, or ``/forget confirm
   <token>``) is carried out by Yak (:mod:`yak_pipeline.services.forget`) and answered as the
   assistant; it never goes upstream, and it is never stored as a turn (that would store the
   very text being forgotten);
3. recall runs on what the user said (the one engine, :func:`services.recall.build_context`) and
   the protocol puts the block into the prompt; recall failing forwards the chat without one and
   counts a ``recall_failed`` degradation;
4. the chat goes upstream and its answer comes back byte for byte
   (:mod:`yak_pipeline.services.proxy_exchange`);
5. a finished answer is stored as ``POST /api/turns`` stores it (``services.memories.record_turn``):
   the exchange becomes a memory, the turn is queued with the recalled ids for warmth. The store is
   handed to :class:`~yak_pipeline.services.turn_writer.TurnWriter` as the answer ends and runs after
   the response is sent, batched with the turns queued beside it: the client does not wait for it
   (unless the writer's queue is full: back-pressure, see there).

What is stored is a finished exchange or nothing ("nothing half-stored"): a stream that breaks
off (the upstream dies, or never finishes) stores no turn, because its truncated answer would be
distilled into facts the model never finished saying and its warmth judged against half an answer;
the client gets an error event instead of a silent end, retries, and the retry's complete answer
is stored. Chats Yak cannot store at full fidelity go through with their memory block but store
nothing: an answer with tool calls or without text, several choices, a last user message with
image or audio parts. Chats that do not end with the user's words (a tool result going back to
the model) continue a turn already recalled for.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from typing import Final, Protocol

import anyio.to_thread
import httpx

from yak_pipeline.core.exchanges import turn_refusal
from yak_pipeline.core.forget import ForgetCommandError, parse_forget_command, parse_forget_confirmation
from yak_pipeline.core.types import InvalidUserId, validate_user_id
from yak_pipeline.llm.errors import one_line
from yak_pipeline.services.exchange_embeddings import embed_exchanges_now
from yak_pipeline.services.forget import ForgetOutcome, confirm_forget, run_forget_command
from yak_pipeline.services.memories import record_turn
from yak_pipeline.services.proxy_exchange import (
    MAX_MESSAGE_CHARS,
    ProxiedChat,
    ProxyAnswer,
    ProxyError,
    ProxyMetrics,
    ProxyStream,
    UpstreamExchange,
    transport_error,
)
from yak_pipeline.services.recall import RecallParts, block_choice, build_context
from yak_pipeline.services.recall_judge import LLMRecallJudge
from yak_pipeline.services.turn_writer import PendingTurn, TurnStore, TurnWriter
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline.store.errors import DatabaseUnavailable

logger = logging.getLogger("yak.proxy")
# The injected memory blocks, logged only when asked for (YAK_PROXY_SHOW_BLOCK): they are private text.
block_logger = logging.getLogger("yak.proxy.block")

_CONNECT_TIMEOUT_SECONDS: Final = 10.0
# How long shutting down waits for turns answered but not yet stored (each store is bounded by the pool's timeout).
_SHUTDOWN_STORE_WAIT_SECONDS: Final = 60.0


def resolve_named_user(key_user: str | None, named: object, *, field: str) -> str:
    """The key's user, else (an admin key) the user the request's ``field`` names: 400 without a valid one.

    Both protocols' rule: OpenAI's ``user``, Anthropic's ``metadata.user_id``. A user-scoped key
    ignores the field: clients fill it with their own end-user ids, and a key must never reach
    another user's memories whatever the body says.
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
        text = one_line(candidate["content"], MAX_MESSAGE_CHARS)
        lines.append(f"{number}. [{candidate['occurred_at']:%Y-%m-%d}] {text}")
    lines.append(f"To forget them, send: /forget confirm {outcome.token}")
    lines.append("(within 10 minutes; anything else keeps them)")
    return "\n".join(lines)


# --- the proxy -------------------------------------------------------------------------------

class ProxyParts(RecallParts, Protocol):
    """What the proxy uses of the app's parts, each built when first read (:class:`yak_pipeline.wiring.YakParts`
    is one): recall's, and the settings, the database and the judge."""

    @property
    def settings(self) -> Settings: ...  # noqa: D102
    @property
    def database(self) -> Database: ...  # noqa: D102
    @property
    def judge(self) -> LLMRecallJudge | None: ...  # noqa: D102


class MemoryProxy:
    """The proxy's flow (module docstring) over the app's parts, read when used so nothing is built before use."""

    def __init__(self, parts: ProxyParts, *, metrics: ProxyMetrics) -> None:
        self.settings = parts.settings
        self._parts = parts
        self.metrics = metrics
        self._client: httpx.AsyncClient | None = None
        self._client_loop: object | None = None
        self.turns: TurnWriter[PendingTurn] = TurnWriter(self._store_turns)
        # Set once warm_documents_in_background has finished (loaded, or failed and logged).
        self.documents_warm = threading.Event()
        if self.settings.proxy_show_block and not block_logger.handlers:
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
                warm_up = getattr(self._parts.embedder, "warm_up", None)
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

    async def pass_through(self, method: str, url: str, *, headers: dict[str, str],
                           content: bytes | None = None) -> httpx.Response:
        """A call that needs no memory (the model list, a token count), sent upstream as it is; a failed
        call raised as the client's error (:func:`~yak_pipeline.services.proxy_exchange.transport_error`)."""
        try:
            return await self.http().request(method, url, headers=headers, content=content)
        except httpx.HTTPError as exc:
            raise transport_error(exc) from None

    # -- memory

    def _recall(self, user_id: str, queries: Sequence[str]) -> tuple[str, list[str]]:
        """The block and recalled ids for ``queries`` (``recall_queries``: the last message first);
        ``("", [])`` and a counted degradation when recall fails."""
        started = time.perf_counter()
        try:
            parts = self._parts
            database, embedder = parts.database, parts.embedder
            params = parts.recall_params(threshold=self.settings.proxy_recall_threshold,
                                         limit=self.settings.proxy_recall_limit)
            block, built = build_context(database, embedder, user_id=user_id, query=queries[0], also=queries[1:],
                                         params=params, model=parts.relevance_model,
                                         judge=parts.judge, choice=block_choice(self.settings))
            error = built.recall_error
        except Exception as exc:  # noqa: BLE001 - no memories is better than no answer
            block, built, error = "", None, f"{type(exc).__name__}: {one_line(exc, MAX_MESSAGE_CHARS)}"
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
        ``record_turn`` took (one whose exchange was stored before included)."""
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
                embed_exchanges_now(self._parts.database, self._parts.embedder, created)
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
            # No embedder here: the batch's exchanges get their vectors together (_store_turns).
            stored = record_turn(self._parts.database, user_id=turn.user_id, user_message=turn.user_text,
                                 assistant_message=turn.answer, recalled_ids=turn.recalled_ids,
                                 occurred_at=turn.occurred_at, actor=turn.actor)
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
                outcome = confirm_forget(self._parts.database, user_id=user_id, token=token, actor=actor)
            else:
                if parse_forget_command(text) is None:
                    return None
                outcome = run_forget_command(self._parts.database, user_id=user_id, command=text, actor=actor)
        except ForgetCommandError as exc:
            return f"Nothing was forgotten: {one_line(exc, MAX_MESSAGE_CHARS)}"
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

    async def _recall_block(self, user_id: str, recall_texts: Sequence[str]) -> tuple[str, list[str]]:
        """The memory block and recalled ids for a chat's ``recall_texts`` (``("", [])`` when there is
        nothing to recall for, recall is switched off, or it fails), logged when asked for."""
        if not recall_texts or self.settings.proxy_recall_limit <= 0:
            return "", []
        block, recalled_ids = await anyio.to_thread.run_sync(self._recall, user_id, recall_texts)
        if block and self.settings.proxy_show_block:
            block_logger.info("memory block for %s (%d memories):\n%s", user_id, len(recalled_ids), block)
        return block, recalled_ids

    async def _forget_answer(self, *, user_id: str, text: str | None, actor: str, read_only: bool) -> str | None:
        """Yak's answer when ``text`` (the last user message) is a forget command, carried out (with a
        ``read_only`` key: refused, nothing forgotten); else None."""
        if text is None or not self._looks_like_forget(text):
            return None
        if read_only:
            return "Nothing was forgotten: this API key is read-only."
        answer = await anyio.to_thread.run_sync(lambda: self._forget(user_id=user_id, text=text, actor=actor))
        return answer or ""

    def _turn_store(self, user_text: str | None, *, user_id: str, recalled_ids: list[str],
                    actor: str, read_only: bool) -> TurnStore | None:
        """What stores the turn once its answer is known (None when ``user_text`` is None: nothing to store,
        or the key is ``read_only``: it is answered, never stored); the store itself runs on the turn
        writer, after the response."""
        if user_text is None or read_only:
            return None
        return TurnStore(self.turns, user_id=user_id, user_text=user_text, recalled_ids=recalled_ids, actor=actor)

    # -- the chat

    async def converse(self, chat: ProxiedChat, *, actor: str, read_only: bool = False) -> ProxyAnswer | ProxyStream:
        """One chat through the proxy (module docstring), in the protocol ``chat`` speaks; raises
        :class:`~yak_pipeline.services.proxy_exchange.ProxyError` for the client.

        With a ``read_only`` key the chat is recalled for and answered, but its turn is not stored
        and a forget command forgets nothing."""
        turn = chat.turn
        text = await self._forget_answer(user_id=chat.user_id, text=turn.forget_text, actor=actor, read_only=read_only)
        if text is not None:
            self.metrics.count_proxy_request("forget", stream=turn.stream)
            return chat.yak_answer(text)
        url, headers = chat.upstream()
        block, recalled_ids = await self._recall_block(chat.user_id, turn.recall_texts)
        request = self.http().build_request("POST", url, headers=headers, content=chat.forwarded(block))
        store = self._turn_store(turn.turn_text, user_id=chat.user_id, recalled_ids=recalled_ids, actor=actor,
                                 read_only=read_only)
        return await UpstreamExchange(self.http(), self.metrics, chat, store, recalled_ids).send(request)
