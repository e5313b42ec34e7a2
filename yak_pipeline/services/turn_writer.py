"""Where the memory proxy stores its turns: after the answer has gone out, in order, several at a time.

Storing a new turn (the exchange's memory, its context and postings, the turn queued for
warmth) takes about 10 ms at 100,000 memories; giving the new exchange its two vectors (its own
text, and in context) with the local model takes 70-200 ms more on one CPU thread. The client has
its answer by then and nothing it does depends on the store, and a failed store is only counted
and logged either way. So the proxy hands the store to this writer and ends the response at once.

One thread, so a user's turns are stored in the order they were answered. The thread takes every
turn waiting (up to ``max_batch``) in one batch: the proxy writes each turn on its own and then
embeds the batch's exchanges in one model call per kind, which costs far less than one call per
turn on a small CPU (docs/BENCHMARKS.md, issue 34). A lone turn is never held back to wait for
company: a batch is whatever queued while the previous one was stored.

When more than ``max_waiting`` turns are queued or being stored (the database is slow or away,
or chats come faster than the model embeds), the next chat stores its turn itself before its
response ends: the queue stays bounded and clients slow down instead of Yak holding an ever
longer backlog in memory. Shutting down (the app's lifespan) waits for the queue, so a turn
answered before a clean stop is stored before the process goes.

A chat hands its turn over through a :class:`TurnStore` (both wire protocols): once, when its
answer is known, and it stores the turn itself when the queue is full.

The writer's thread runs at a lower CPU priority than the chats (:func:`_yield_to_chats`). Its
model calls take a whole core for tens of milliseconds, and on a small machine a chat's recall
(the query's vector, the legs in PostgreSQL, the ranking) then shared the other core: with the
store beside it, the proxy's added p95 was about twice what ``/api/context`` takes alone at
100,000 memories. A stored turn can wait a few milliseconds; the answer the user waits for cannot.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Generic, TypeVar

import anyio.to_thread

logger = logging.getLogger("yak.proxy")

MAX_WAITING_TURNS: Final = 256
# The most turns one batch stores: their 32 texts of a kind fit one forward pass of the local model
# (64 texts), and a batch's first turn waits for the whole batch's vectors before recall finds it by meaning.
MAX_BATCH_TURNS: Final = 32

# The writer thread's niceness (0 is the chats', 19 the least): at 10 the scheduler gives a
# runnable chat thread about nine tenths of a contested core, and the writer the rest.
WRITER_NICENESS: Final = 10

T = TypeVar("T")


def _yield_to_chats() -> None:
    """Lower the calling thread's CPU priority to :data:`WRITER_NICENESS` (Linux: per thread).

    Only this thread: on Linux ``setpriority`` on a thread's id sets that thread alone, and the
    threads it starts later inherit it. Elsewhere the same call would read the thread's id as a
    process id (another process's, or none), so there the writer runs at the chats' priority, as
    it does where Linux refuses.
    """
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICENESS)


class TurnWriter(Generic[T]):
    """A one-thread queue of turns, stored in batches by ``store_batch``; counts those not yet stored
    and can wait for them."""

    def __init__(self, store_batch: Callable[[Sequence[T]], object], *, max_waiting: int = MAX_WAITING_TURNS,
                 max_batch: int = MAX_BATCH_TURNS) -> None:
        self.max_waiting = max_waiting
        self.max_batch = max(1, max_batch)
        self._store_batch = store_batch
        # A ThreadPoolExecutor's worker is joined at interpreter exit, so a batch being stored finishes.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="yak-turn-writer",
                                            initializer=_yield_to_chats)
        self._settled = threading.Condition()
        self._queue: deque[T] = deque()
        self._draining = False
        self._waiting = 0

    @property
    def waiting(self) -> int:
        """Turns queued or being stored."""
        with self._settled:
            return self._waiting

    def submit(self, turn: T, *, over_limit: bool = False) -> bool:
        """Queue ``turn``; False, and nothing queued, when ``max_waiting`` turns wait already (the caller
        stores it, :meth:`store_now`). ``over_limit`` queues it anyway: for a chat whose client left
        before it could store its own turn."""
        with self._settled:
            if self._waiting >= self.max_waiting and not over_limit:
                return False
            self._waiting += 1
            self._queue.append(turn)
            if self._draining:
                return True  # the running drain takes it with the next batch
            self._draining = True
        try:
            self._executor.submit(self._drain)
        except RuntimeError:  # the interpreter is exiting: no new threads, so the queue is stored here
            self._drain()
        return True

    def store_now(self, turns: Sequence[T]) -> None:
        """Store ``turns`` in the caller's thread (a chat that found the queue full), as a batch is stored."""
        self._store(list(turns))

    def _drain(self) -> None:
        while True:
            with self._settled:
                batch = [self._queue.popleft() for _ in range(min(self.max_batch, len(self._queue)))]
                if not batch:
                    self._draining = False
                    return
            try:
                self._store(batch)
            finally:
                self._done(len(batch))

    def _store(self, batch: list[T]) -> None:
        started = time.perf_counter()
        try:
            self._store_batch(batch)
        except Exception as exc:  # noqa: BLE001 - stores count and log their own failures; this is the last guard
            # Only the type, as the proxy logs every failure: a message could carry the database's URL.
            logger.error("a batch of %d proxied turns failed unexpectedly: %s", len(batch), type(exc).__name__)
            return
        logger.debug("stored a batch of %d proxied turns in %.0f ms", len(batch),
                     (time.perf_counter() - started) * 1000)

    def _done(self, count: int) -> None:
        with self._settled:
            self._waiting -= count
            if self._waiting == 0:
                self._settled.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every queued turn is stored; False if ``timeout`` seconds passed first."""
        with self._settled:
            return self._settled.wait_for(lambda: self._waiting == 0, timeout)


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
