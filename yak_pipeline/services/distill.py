"""Distil pending memories: LLM → validate → embed → confidence gate → store, one memory at a time.

Each memory is handled in its own transaction that holds a ``FOR UPDATE SKIP LOCKED`` lock on
it from claim to commit: the distillation, its embedding, its gate decision, its first version
and the memory's new status commit together or not at all (a killed worker leaves the memory
``pending``), and two workers never distil the same memory. LLM calls run concurrently up to
``concurrency`` (one pooled connection per worker; a worker gives its LLM slot back once the
answer is in, see ``distill_memories``), and the exchange's own vectors are made while the LLM
answers.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import date

from yak_pipeline.alerts import NULL_ALERTER, Alerter
from yak_pipeline.core.exchanges import users_words
from yak_pipeline.core.gates import confidence_gate
from yak_pipeline.core.memory_types import typed
from yak_pipeline.embeddings import Embedder, EmbeddingError
from yak_pipeline.llm.errors import LLMError, reason_for_log
from yak_pipeline.llm.prompts import OUTPUT_SCHEMA_VERSION
from yak_pipeline.llm.provider import LLMProvider
from yak_pipeline.services.exchange_embeddings import embed_pending_contexts
from yak_pipeline.services.reports import StageReport
from yak_pipeline.store.database import Database
from yak_pipeline.store.distillations import NewDistillation, insert_distillation, live_distillation_of, redistill
from yak_pipeline.store.locking import lock_live_row
from yak_pipeline.store.memories import (
    MemoryToDistil,
    context_to_embed,
    mark_memory_distilled,
    memories_to_distill,
    record_memory_error,
    users_of_memories,
)
from yak_pipeline.store.metrics import record_distillation_latency

logger = logging.getLogger(__name__)

DEFAULT_MAX_ATTEMPTS = 5


@dataclass(frozen=True)
class DistillJob:
    """What a distillation run needs besides the memories."""

    db: Database
    llm: LLMProvider
    embedder: Embedder
    prompt_version: str
    alerter: Alerter = NULL_ALERTER
    max_attempts: int = DEFAULT_MAX_ATTEMPTS


def partition_memory_ids(db: Database, *, user_id: str, day: date | None, include_outdated: bool,
                         prompt_version: str) -> list[str]:
    """Ids of the partition's memories that need (re-)distilling, oldest first.

    Pending memories always; with ``include_outdated`` also distilled memories whose live
    distillation was made by another prompt or output-schema version (the backfill case).
    """
    with db.connection() as conn:
        return memories_to_distill(conn, user_id=user_id, day=day, include_outdated=include_outdated,
                                   prompt_version=prompt_version, schema_version=OUTPUT_SCHEMA_VERSION)


class _LLMSlot:
    """One of a run's ``concurrency`` LLM slots, held from claiming a memory until its LLM call returns.

    Taken before the pooled connection, so a worker waiting for a slot holds neither a connection
    nor a row lock; given back as soon as the answer is in (:meth:`release`), so the memory's
    embedding and writes no longer keep an LLM call from starting.
    """

    def __init__(self, slots: threading.Semaphore) -> None:
        self._slots = slots
        self._held = False

    def __enter__(self) -> _LLMSlot:
        self._slots.acquire()
        self._held = True
        return self

    def release(self) -> None:
        """Give the slot back (once; later calls do nothing)."""
        if self._held:
            self._held = False
            self._slots.release()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _distill_one(job: DistillJob, memory_id: str, early: Executor, llm_slots: threading.Semaphore) -> StageReport:
    """Distil one memory in its own transaction; ``early`` embeds its exchange while the LLM answers,
    and one of ``llm_slots`` is held until the LLM has answered."""
    report = StageReport(rows_in=1)
    with _LLMSlot(llm_slots) as slot, job.db.connection() as conn:
        started = time.monotonic()
        row = lock_live_row(conn, "memories", memory_id, MemoryToDistil)
        if row is None:
            report.skipped += 1  # another worker has it, or it was forgotten meanwhile
            return report
        user_id, content, occurred_at, attempts, status = (row.user_id, row.content, row.occurred_at, row.attempts,
                                                           row.status)
        existing = live_distillation_of(conn, memory_id)
        if status != "pending" and (existing is None or (existing.prompt_version == job.prompt_version
                                                         and existing.schema_version == OUTPUT_SCHEMA_VERSION)):
            report.skipped += 1  # done by someone else since it was listed
            return report
        # The exchange's own text, and its text read with its neighbours when that vector is due
        # (sql/008), are known before the LLM answers: they are embedded while it thinks, on cores
        # that would otherwise wait with it, and only the distillation is embedded after the answer.
        # (A context vector used to be made after the run, by one single-threaded pass over every
        # context; embed_pending_contexts, below, now finds only those a later neighbour changed.)
        context = context_to_embed(conn, memory_id, embedding_model=job.embedder.model_name)
        exchange_vectors = early.submit(job.embedder.embed_documents,
                                        [content, *([context] if context is not None else [])])
        try:
            result = job.llm.distill(content)
        except LLMError as exc:
            slot.release()
            exchange_vectors.cancel()  # when it has not started yet; otherwise its vectors go unused
            give_up = attempts + 1 >= job.max_attempts
            record_memory_error(conn, memory_id, exc.reason, give_up=give_up)
            report.record_failed_call(exc)
            report.failed += 1
            # The run's log and the alert name the memory, not its text (nor a reply quoting it).
            report.errors.append(f"{memory_id}: {reason_for_log(exc.reason)}")
            job.alerter.alert("distillation_failed", f"distilling memory {memory_id} failed", ids=(memory_id,),
                              error=reason_for_log(exc.reason), retry=(attempts + 1, job.max_attempts))
            return report
        slot.release()
        report.record_call(result.stats)
        try:
            # The distillation's vector, and the exchange's (and context's), embedded while the LLM answered:
            # hybrid recall searches both.
            embedding = job.embedder.embed_documents([result.content])[0]
            exchange_embedding, *context_embedding = exchange_vectors.result()
        except EmbeddingError as exc:
            record_memory_error(conn, memory_id, str(exc), give_up=False)
            report.failed += 1
            report.errors.append(f"{memory_id}: {exc}")
            job.alerter.alert("embedding_failed", f"embedding memory {memory_id} failed", ids=(memory_id,),
                              error=str(exc))
            return report
        decision = confidence_gate(result.confidence)
        # An event's day, resolved offline against when the exchange happened (the distiller gives the type).
        kind = typed(result.memory_type, users_words(content)[0], occurred_at.date(), distilled=result.content)
        if existing is None:
            distillation_id = insert_distillation(conn, NewDistillation(
                memory_id=memory_id, user_id=user_id, content=result.content, confidence=result.confidence,
                tier=result.tier, embedding=embedding, embedding_model=job.embedder.model_name,
                prompt_version=job.prompt_version, refreshed_at=occurred_at, schema_version=OUTPUT_SCHEMA_VERSION,
                memory_type=kind.memory_type, event_on=kind.event_on,
            ))
        else:
            # Re-distillation after a prompt change: a new version, the old text kept in history.
            distillation_id = existing.id
            redistill(conn, distillation_id, content=result.content, embedding=embedding,
                      embedding_model=job.embedder.model_name, confidence=result.confidence, tier=result.tier,
                      prompt_version=job.prompt_version, schema_version=OUTPUT_SCHEMA_VERSION,
                      refreshed_at=occurred_at, memory_type=kind.memory_type, event_on=kind.event_on)
        record_distillation_latency(conn, (time.monotonic() - started) * 1000)
        mark_memory_distilled(conn, memory_id, embedding=exchange_embedding, embedding_model=job.embedder.model_name,
                              context_embedding=context_embedding[0] if context_embedding else None)
    report.rows_out += 1
    report.flagged += int(decision.needs_review)
    report.ids.append(str(distillation_id))
    return report


def distill_memories(job: DistillJob, memory_ids: Sequence[str], *, concurrency: int = 4) -> StageReport:
    """Distil the given memories with up to ``concurrency`` LLM calls at once.

    From ``concurrency`` 4 on, up to a quarter more workers than LLM slots, as far as the pool has
    connections for them (each worker holds one): after its answer a memory's distillation is
    embedded and written (about a quarter of a 200 ms call's wait, bench/ingest_throughput.py), and
    meanwhile another worker's LLM call runs in its slot. Below 4 there are as many workers as
    slots, and ``concurrency`` 1 distils one memory after another, in order.
    """
    total = StageReport()
    if not memory_ids:
        return total
    slots = max(1, concurrency)
    # No more workers than connections beyond the slots': a worker with a slot must not wait long
    # for a connection (the pool gives up after POOL_WAIT_SECONDS).
    workers = slots + max(0, min(slots // 4, job.db.max_connections - slots))
    llm_slots = threading.BoundedSemaphore(slots)
    with (ThreadPoolExecutor(max_workers=workers, thread_name_prefix="yak-distil") as pool,
          ThreadPoolExecutor(max_workers=workers, thread_name_prefix="yak-distil-early") as early):
        for report in pool.map(lambda memory_id: _distill_one(job, memory_id, early, llm_slots), memory_ids):
            total.merge(report)
    # New exchanges gave themselves and their neighbours a new context (sql/008): recall's
    # context vectors catch up here, in the same run, for these memories' users only (a run does
    # its own users' work; another user's backlog is their runs' or `yak db index`'s).
    try:
        with job.db.connection() as conn:
            users = users_of_memories(conn, memory_ids)
        for user_id in users:
            embed_pending_contexts(job.db, job.embedder, user_id=user_id)
    except EmbeddingError as exc:
        # Recall works without them (the exchange's own vector stands in); the next run retries.
        logger.warning("context vectors not updated: %s", exc)
    return total
