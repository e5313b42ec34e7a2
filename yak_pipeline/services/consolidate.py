"""After distillation: contradiction scores, then near-duplicate consolidation (DESIGN §4).

Deterministic steps first — same-user neighbours by vector distance, the 0.85 similarity bar,
the open-conflict exclusion — and the LLM only for the judgement (is this a contradiction? how
do these two read as one?). Each distillation is checked once (``conflict_checked_at`` /
``dedup_checked_at``) inside a transaction that locks it, so re-runs and concurrent runs
neither repeat nor double a merge.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date

import psycopg

from yak_pipeline.alerts import NULL_ALERTER, Alerter
from yak_pipeline.core.dedup import CONFLICT_CHECK_TOP_K, conflict_candidates, is_conflict
from yak_pipeline.embeddings import Embedder, EmbeddingError
from yak_pipeline.llm.errors import LLMError
from yak_pipeline.llm.provider import LLMProvider
from yak_pipeline.services.merge_lookahead import Foresight, look_ahead, merge_pair
from yak_pipeline.services.reports import StageReport
from yak_pipeline.store.conflicts import record_conflict
from yak_pipeline.store.consolidation_checks import (
    CheckedDistillation,
    lock_unchecked,
    mark_checked,
    unchecked_distillations,
)
from yak_pipeline.store.database import Database
from yak_pipeline.store.distillations import add_version, contents_by_id, nearest_active, set_distillation_status
from yak_pipeline.store.metrics import record_error

# How many unchecked distillations the merge stage works out ahead of committing them (see
# ``merge_near_duplicates``): enough to give the embedder a real batch, few enough that the
# look-ahead rarely goes stale.
MERGE_LOOKAHEAD = 32


@dataclass(frozen=True)
class ConsolidateJob:
    """What the conflict and merge stages need."""

    db: Database
    llm: LLMProvider
    embedder: Embedder
    alerter: Alerter = NULL_ALERTER
    # Concurrent consolidation calls while the merge stage looks ahead (see ``merge_near_duplicates``).
    concurrency: int = 1
    # How many distillations the merge stage works out ahead; 1 is the plain one-by-one loop.
    lookahead: int = MERGE_LOOKAHEAD


def _unchecked(db: Database, *, user_id: str, day: date | None, column: str, require: str | None = None) -> list[str]:
    """Active distillations of the partition not yet checked by ``column``, oldest first."""
    with db.connection() as conn:
        return unchecked_distillations(conn, user_id=user_id, day=day, column=column, require=require)


@contextmanager
def _claim(job: ConsolidateJob, distillation_id: str, column: str,
           report: StageReport) -> Iterator[tuple[psycopg.Connection, CheckedDistillation] | None]:
    """A transaction holding the distillation's lock and its row, or None (counted as skipped) when
    it is gone, held by another worker or already checked by ``column``."""
    report.rows_in += 1
    with job.db.connection() as conn:
        row = lock_unchecked(conn, distillation_id, column)
        if row is None:
            report.skipped += 1
            yield None
        else:
            yield conn, row


def _count_failure(conn: psycopg.Connection, report: StageReport, distillation_id: str, exc: Exception,
                   error_type: str) -> None:
    """Undo the distillation's work and count why: it stays unchecked, and the next run tries again."""
    if isinstance(exc, LLMError):
        report.record_failed_call(exc)
    conn.rollback()
    record_error(conn, error_type)
    report.failed += 1
    report.errors.append(f"{distillation_id}: {getattr(exc, 'reason', exc)}")


def score_conflicts(job: ConsolidateJob, *, user_id: str, day: date | None) -> StageReport:
    """Score each new distillation against its similar active ones; > 0.7 records a conflict.

    Up to ``job.concurrency`` distillations are checked at once, each in its own transaction on
    its own connection (a remote LLM's conflict calls wait in parallel; offline, the database's
    round trips do). Two of them that contradict each other may meet: recording the pair touches
    both rows, so one check can find the other's row held, or the database breaks a deadlock
    between them. Such a check is undone and done again after the others, one at a time, so the
    outcome is the one-after-another outcome.
    """
    report = StageReport()
    ids = _unchecked(job.db, user_id=user_id, day=day, column="conflict_checked_at")
    workers = min(job.concurrency, job.db.max_connections - 1, len(ids))
    again = ids
    if workers > 1:
        again = []
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="yak-conflicts") as pool:
            for distillation_id, (done, mine) in zip(ids, pool.map(lambda i: _check_conflicts(job, i), ids)):
                if not done:
                    # Checked again below; only the LLM calls the undone attempt made count from it.
                    again.append(distillation_id)
                    mine.rows_in = mine.skipped = mine.flagged = 0
                    mine.ids.clear()
                report.merge(mine)
    for distillation_id in again:
        report.merge(_check_conflicts(job, distillation_id, retry=False)[1])
    return report


def _check_conflicts(job: ConsolidateJob, distillation_id: str, *, retry: bool = True) -> tuple[bool, StageReport]:
    """Check one distillation for conflicts in one transaction: ``(done, report)``.

    With ``retry``, a distillation found held (by another worker of this stage, or of another
    run) or caught in a deadlock is left undone (``done`` False) for the caller to check again.
    """
    report = StageReport()
    with _claim(job, distillation_id, "conflict_checked_at", report) as claimed:
        if claimed is None:
            return not retry, report
        conn, row = claimed
        owner, content, embedding, model = row.user_id, row.content, row.embedding, row.embedding_model
        neighbours = nearest_active(conn, user_id=owner, embedding=embedding, embedding_model=model,
                                    limit=CONFLICT_CHECK_TOP_K, exclude_id=distillation_id)
        candidates = conflict_candidates(distillation_id, owner, neighbours)
        # All candidates' texts in one round trip rather than one query per candidate.
        texts = contents_by_id(conn, [n.id for n in candidates])
        alerts: list[tuple[str, float]] = []
        try:
            for neighbour in candidates:
                result = job.llm.conflict_score(texts[neighbour.id], content)
                report.record_call(result.stats)
                if is_conflict(result.score):
                    conflict_id = record_conflict(conn, user_id=owner, a=distillation_id, b=neighbour.id,
                                                  score=result.score)
                    if conflict_id is not None:
                        report.flagged += 1
                        report.ids.append(str(conflict_id))
                        alerts.append((str(neighbour.id), result.score))
        except psycopg.errors.DeadlockDetected:
            if not retry:
                raise
            conn.rollback()
            return False, report
        except LLMError as exc:
            _count_failure(conn, report, distillation_id, exc, "conflict_score_failed")
            return True, report
        mark_checked(conn, [distillation_id], "conflict_checked_at")
        report.rows_out += 1
    # Alerted once the conflicts are committed (a check undone above records none).
    for other, score in alerts:
        job.alerter.alert("conflict_detected", f"two memories of {owner} contradict each other",
                          level="warn", ids=(distillation_id, other), error=f"score {score:.2f}")
    return True, report


def merge_near_duplicates(job: ConsolidateJob, *, user_id: str, day: date | None) -> StageReport:
    """Consolidate each new distillation with its nearest near-duplicate, if any (DESIGN §4).

    The older distillation gets a new version (``merged_from`` the newer one); the newer one
    becomes ``merged``. Never across users, never a pair in conflict, never before the
    distillation's conflict check.

    Distillations are handled one after another, oldest first, each in its own transaction that
    locks it (and its merge target) and re-runs the neighbour search on what is committed. To
    embed consolidated texts in batches rather than one model call per merge, the next
    ``MERGE_LOOKAHEAD`` distillations' merges are first worked out on the committed state
    (``merge_lookahead.look_ahead``, which follows chains of merges into one survivor); at each
    one's turn the look-ahead result is used only if the same pair with the same texts comes out
    again, otherwise the merge is worked out there and then. Either way the outcome is the
    one-by-one outcome.
    """
    report = StageReport()
    pending = _unchecked(job.db, user_id=user_id, day=day, column="dedup_checked_at", require="conflict_checked_at")
    while pending:
        covered, foresights = look_ahead(job.db, job.llm, job.embedder, pending[:max(1, job.lookahead)], report,
                                         concurrency=job.concurrency)
        chunk, pending = pending[:covered], pending[covered:]
        for distillation_id in chunk:
            _merge_one(job, distillation_id, foresights.get(distillation_id), report)
    return report


def _merge_one(job: ConsolidateJob, distillation_id: str, foresight: Foresight | None, report: StageReport) -> None:
    """Check one distillation for a near-duplicate and merge them, in one transaction."""
    with _claim(job, distillation_id, "dedup_checked_at", report) as claimed:
        if claimed is None:
            return
        conn, row = claimed
        found, pair = merge_pair(conn, distillation_id, row, lock=True)
        if found and pair is None:
            report.skipped += 1  # being merged elsewhere right now; the next run retries
            return
        if pair is not None:
            older, newer = pair.older, pair.newer
            if foresight is None or foresight.inputs != pair.inputs():
                foresight = Foresight(inputs=pair.inputs())  # the look-ahead went stale: work it out now
            try:
                if foresight.error is not None:
                    raise foresight.error
                merged = foresight.merged
                if merged is None:
                    merged = job.llm.consolidate(older.content, newer.content)
                    report.record_call(merged.stats)
                vector = foresight.vector
                if vector is None:
                    vector = job.embedder.embed_documents([merged.content])[0]
            except (LLMError, EmbeddingError) as exc:
                _count_failure(conn, report, distillation_id, exc, "consolidation_failed")
                return
            add_version(conn, older.id, content=merged.content, embedding=vector,
                        embedding_model=job.embedder.model_name, reason="merged", merged_from=[newer.id],
                        refreshed_at=max(older.refreshed_at, newer.refreshed_at))
            set_distillation_status(conn, newer.id, status="merged", action="merge")
            mark_checked(conn, [older.id, newer.id], "dedup_checked_at")
            report.flagged += 1
            report.ids.append(str(older.id))
        else:
            mark_checked(conn, [distillation_id], "dedup_checked_at")
        report.rows_out += 1
