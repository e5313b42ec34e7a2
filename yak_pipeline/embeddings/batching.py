"""Coalescing concurrent embedding requests into one model call ("group commit" for embeddings).

A local model on a small CPU is throughput-bound: one call on 16 texts costs far less than 16
calls on one text each, and several threads running the model at once only fight over the same
cores (each torch call spreads over every core). :class:`Coalescer` therefore runs one batch at a
time and, while it runs, lets the texts of other callers queue up; the next batch takes all of
them. A lone caller is never delayed (no timer, no waiting for company): batching only happens
when callers actually overlap, e.g. the distillation workers of one run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class _Request(Generic[T]):
    """One caller's texts and, once its batch has run, their vectors or the batch's error."""

    __slots__ = ("texts", "vectors", "error", "done")

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.vectors: list[T] = []
        self.error: BaseException | None = None
        self.done = False


class Coalescer(Generic[T]):
    """Calls ``embed_batch`` for many threads, one batch at a time, merging requests that overlap.

    ``max_texts`` bounds a batch (a request larger than that still goes in one piece);
    ``max_parallel`` batches may run at once (e.g. one per core for a single-threaded model).
    Results come back in each caller's order; when a batch fails, every caller in it gets the error.
    """

    def __init__(self, embed_batch: Callable[[list[str]], Sequence[T]], *, max_texts: int = 256,
                 max_parallel: int = 1) -> None:
        self._embed_batch = embed_batch
        self._max_texts = max(1, max_texts)
        self._max_parallel = max(1, max_parallel)
        self._cond = threading.Condition()
        self._queue: list[_Request[T]] = []
        self._running = 0

    def __call__(self, texts: Sequence[str]) -> list[T]:
        """The vectors of ``texts``, computed alone or together with other callers' texts."""
        request: _Request[T] = _Request(list(texts))
        if not request.texts:
            return []
        with self._cond:
            self._queue.append(request)
            while True:
                while (self._running >= self._max_parallel or request not in self._queue) and not request.done:
                    self._cond.wait()
                if request.done:
                    break
                # A batch slot is free and this request still waits: this caller runs the next batch,
                # its own request included unless the queue ahead of it already fills one (then it
                # loops, and runs or joins a later batch).
                self._running += 1
                batch = self._take_batch()
                self._cond.release()
                try:
                    self._run(batch)
                finally:
                    self._cond.acquire()
                    self._running -= 1
                    self._cond.notify_all()
        if request.error is not None:
            raise request.error
        return request.vectors

    def _take_batch(self) -> list[_Request[T]]:
        """Pop requests, oldest first, up to ``max_texts`` texts (always at least one request)."""
        batch: list[_Request[T]] = []
        size = 0
        while self._queue and (not batch or size + len(self._queue[0].texts) <= self._max_texts):
            request = self._queue.pop(0)
            batch.append(request)
            size += len(request.texts)
        return batch

    def _run(self, batch: list[_Request[T]]) -> None:
        """Embed the batch's texts in one call and hand each request its slice (or the error)."""
        try:
            vectors = list(self._embed_batch([text for request in batch for text in request.texts]))
            expected = sum(len(request.texts) for request in batch)
            if len(vectors) != expected:
                raise RuntimeError(f"embedder returned {len(vectors)} vectors for {expected} texts")
        except BaseException as exc:  # noqa: BLE001 - handed to every waiting caller, then re-raised by each
            for request in batch:
                request.error, request.done = exc, True
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt and the like stop the thread that ran the batch at once
            return
        start = 0
        for request in batch:
            request.vectors = vectors[start : start + len(request.texts)]
            request.done = True
            start += len(request.texts)
