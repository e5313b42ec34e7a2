"""Where the memory proxy stores its turns: after the answer has gone out, one at a time, in order.

Storing a new turn (the exchange's memory, its context and postings, the turn queued for
warmth) takes about 10 ms at 100,000 memories. The client has its answer by then and nothing
it does depends on the store: recall finds a turn only once the pipeline has distilled it, and
a failed store is only counted and logged either way. So the proxy hands the store to this
writer and ends the response at once.

One thread, so a user's turns are stored in the order they were answered. When more than
``max_waiting`` stores are queued (the database is slow or away), the next chat stores its turn
itself before its response ends: the queue stays bounded and clients slow down instead of
Yak holding an ever longer backlog in memory. Shutting down (the app's lifespan) waits for
the queue, so a turn answered before a clean stop is stored before the process goes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Final

logger = logging.getLogger("yak.proxy")

MAX_WAITING_TURNS: Final = 256


class TurnWriter:
    """A one-thread queue of turn stores, with a count of those not yet done and a way to wait for them."""

    def __init__(self, *, max_waiting: int = MAX_WAITING_TURNS) -> None:
        self.max_waiting = max_waiting
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="yak-turn-writer")
        self._settled = threading.Condition()
        self._waiting = 0

    @property
    def waiting(self) -> int:
        """Stores queued or running."""
        with self._settled:
            return self._waiting

    def submit(self, store: Callable[[], object]) -> bool:
        """Queue ``store`` (which handles its own failures); False, and nothing queued, when the queue is full."""
        with self._settled:
            if self._waiting >= self.max_waiting:
                return False
            self._waiting += 1
        try:
            self._executor.submit(self._run, store)
        except RuntimeError:  # the interpreter is exiting: no new threads
            self._done()
            return False
        return True

    def _run(self, store: Callable[[], object]) -> None:
        try:
            store()
        except Exception as exc:  # noqa: BLE001 - stores count and log their own failures; this is the last guard
            # Only the type, as the proxy logs every failure: a message could carry the database's URL.
            logger.error("a proxied turn's store failed unexpectedly: %s", type(exc).__name__)
        finally:
            self._done()

    def _done(self) -> None:
        with self._settled:
            self._waiting -= 1
            if self._waiting == 0:
                self._settled.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every queued store is done; False if ``timeout`` seconds passed first."""
        with self._settled:
            return self._settled.wait_for(lambda: self._waiting == 0, timeout)
