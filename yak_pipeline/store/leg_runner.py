"""Recall's leg runner: a recall's queries run side by side, on the request's connection and spares.

Each leg is one query that PostgreSQL runs on one core; :func:`run_legs` runs a recall's legs one
after another on the request's connection, or side by side with helper threads on spare
connections, each taking the next leg not yet started. :class:`Once` is a value the first leg to
need it computes and the others wait for. No SQL of its own: the legs bring theirs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from typing import Final, Generic, TypeVar, cast

import psycopg

logger = logging.getLogger("yak.recall")

T = TypeVar("T")

# Threads that run recall's legs on spare connections (the caller's thread runs them on its own).
# The legs wait on PostgreSQL, not on Python: the threads only hold a connection each.
_LEG_THREADS: Final[ThreadPoolExecutor] = ThreadPoolExecutor(max_workers=8, thread_name_prefix="yak-recall-leg")

# A connection for one helper thread's legs: one the caller holds, or a call that lends one for
# as long as the helper runs legs (None when there is none free: ``Database.idle_connection``).
Spare = psycopg.Connection | Callable[[], AbstractContextManager[psycopg.Connection | None]]


class _Legs(Generic[T]):
    """One recall's legs, taken one at a time by the threads that run them, and their results."""

    def __init__(self, legs: Sequence[Callable[[psycopg.Connection], T]]) -> None:
        self._legs = legs
        self._taken = 0
        self._running = 0
        self._results: list[T | None] = [None] * len(legs)
        self._error: BaseException | None = None
        self._changed = threading.Condition()

    def run_on(self, conn: psycopg.Connection) -> None:
        """Run the next leg not yet taken on ``conn``, until none is left (or one failed)."""
        while True:
            with self._changed:
                if self._error is not None or self._taken == len(self._legs):
                    return
                index, self._taken, self._running = self._taken, self._taken + 1, self._running + 1
            try:
                value = self._legs[index](conn)
            except BaseException as exc:
                with self._changed:
                    self._error = self._error or exc
                    self._running -= 1
                    self._changed.notify_all()
                return
            with self._changed:
                self._results[index] = value
                self._running -= 1
                self._changed.notify_all()

    def results(self) -> list[T]:
        """Every leg's result in order, once no leg is running and none is left; raises what a leg raised."""
        with self._changed:
            self._changed.wait_for(lambda: self._running == 0
                                   and (self._error is not None or self._taken == len(self._legs)))
        if self._error is not None:
            raise self._error
        return cast(list[T], self._results)  # every slot is filled when none failed


def _help(legs: _Legs[T], spare: Spare) -> None:
    """A helper thread: borrow the spare connection, run legs on it, give it back."""
    with nullcontext(spare) if isinstance(spare, psycopg.Connection) else spare() as conn:
        if conn is not None:
            legs.run_on(conn)


def _log_helper_failure(done: Future[None]) -> None:
    """Log a helper thread that failed outside its legs (a leg's own error is the recall's)."""
    # A helper's legs report their own errors; what is left is borrowing or giving back its
    # connection (the pool replaces a broken one), which no recall waits for.
    if not done.cancelled() and done.exception() is not None:
        logger.warning("a recall helper could not borrow or give back its connection: %s", done.exception())


def run_legs(conn: psycopg.Connection, legs: Sequence[Callable[[psycopg.Connection], T]],
             spare: Sequence[Spare] = ()) -> list[T]:
    """Each leg's result, in order: one after another on ``conn``, or side by side with helper threads
    on ``spare`` connections, each thread taking the next leg not yet started until none is left.

    Each leg is one query that PostgreSQL runs on one core; side by side they use the others
    (docs/BENCHMARKS.md: the five legs at 100,000 rows, p50 78 → 48 ms on 2 cores). A helper
    borrows its connection itself, while the caller's thread runs the first leg, and gives it
    back (a commit) after the last leg it ran has reported: neither waits in the recall.
    """
    if not spare:
        return [leg(conn) for leg in legs]
    shared = _Legs(legs)
    helpers = [_LEG_THREADS.submit(_help, shared, s) for s in spare]
    for helper in helpers:
        helper.add_done_callback(_log_helper_failure)
    shared.run_on(conn)
    for helper in helpers:
        # One still queued (the threads busy with other recalls) has nothing left to do.
        helper.cancel()
    # Every leg taken has reported: a helper may still be giving its connection back.
    return shared.results()


class Once(Generic[T]):
    """A value computed on the connection of whichever leg asks first; the others wait for it."""

    def __init__(self, compute: Callable[[psycopg.Connection], T]) -> None:
        self._compute = compute
        self._lock = threading.Lock()
        self._done: list[T] = []

    def __call__(self, conn: psycopg.Connection) -> T:
        with self._lock:
            if not self._done:
                self._done.append(self._compute(conn))
            return self._done[0]
