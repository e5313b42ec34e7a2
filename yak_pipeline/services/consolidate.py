"""After distillation: contradiction scores, then near-duplicate consolidation (DESIGN §4).

Deterministic steps first — same-user neighbours by vector distance, the 0.85 similarity bar,
the open-conflict exclusion — and the LLM only for the judgement (is this a contradiction? how
do these two read as one?). Each distillation is checked once (``conflict_checked_at`` /
``dedup_checked_at``) inside a transaction that locks it, so re-runs and concurrent runs
neither repeat nor double a merge.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from yak_pipeline.alerts import NULL_ALERTER, Alerter
from yak_pipeline.core.dedup import (
    CONFLICT_CHECK_TOP_K,
    NEAR_DUPLICATE_TOP_K,
    choose_merge_target,
    conflict_candidates,
    is_conflict,
    select_near_duplicates,
)
from yak_pipeline.embeddings import Embedder, EmbeddingError
from yak_pipeline.llm.errors import LLMError
from yak_pipeline.llm.provider import LLMProvider
from yak_pipeline.services.reports import StageReport
from yak_pipeline.store.conflicts import conflicting_ids, record_conflict
from yak_pipeline.store.database import Database
from yak_pipeline.store.distillations import add_version, nearest_active, set_distillation_status
from yak_pipeline.store.metrics import record_error


@dataclass(frozen=True)
class ConsolidateJob:
    """What the conflict and merge stages need."""

    db: Database
    llm: LLMProvider
    embedder: Embedder
    alerter: Alerter = NULL_ALERTER


def _unchecked(db: Database, *, user_id: str, day: date | None, column: str, require: str | None = None) -> list[str]:
    """Active distillations of the partition not yet checked by ``column``, oldest first."""
    extra = f" AND d.{require} IS NOT NULL" if require else ""
    with db.connection() as conn:
        rows = conn.execute(
            f"""SELECT d.id FROM distillations d JOIN memories m ON m.id = d.memory_id
                WHERE d.user_id = %(user)s AND d.status = 'active' AND d.deleted_at IS NULL
                  AND d.{column} IS NULL{extra}
                  AND (%(day)s::date IS NULL OR (m.occurred_at AT TIME ZONE 'UTC')::date = %(day)s)
                ORDER BY d.created_at, d.id""",  # noqa: S608 - column names are constants of this module
            {"user": user_id, "day": day},
        ).fetchall()
    return [str(r[0]) for r in rows]


def _lock_active(conn, distillation_id: str, column: str):  # noqa: ANN001, ANN202
    return conn.execute(
        f"""SELECT id, user_id, content, embedding, embedding_model, created_at, refreshed_at FROM distillations
            WHERE id = %s AND status = 'active' AND deleted_at IS NULL AND {column} IS NULL
            FOR UPDATE SKIP LOCKED""",  # noqa: S608 - column names are constants of this module
        (distillation_id,),
    ).fetchone()


def score_conflicts(job: ConsolidateJob, *, user_id: str, day: date | None) -> StageReport:
    """Score each new distillation against its similar active ones; > 0.7 records a conflict."""
    report = StageReport()
    for distillation_id in _unchecked(job.db, user_id=user_id, day=day, column="conflict_checked_at"):
        report.rows_in += 1
        with job.db.connection() as conn:
            row = _lock_active(conn, distillation_id, "conflict_checked_at")
            if row is None:
                report.skipped += 1
                continue
            _, owner, content, embedding, model, _, _ = row
            neighbours = nearest_active(conn, user_id=owner, embedding=embedding, embedding_model=model,
                                        limit=CONFLICT_CHECK_TOP_K, exclude_id=distillation_id)
            try:
                for neighbour in conflict_candidates(distillation_id, owner, neighbours):
                    other = conn.execute("SELECT content FROM distillations WHERE id = %s", (neighbour.id,)).fetchone()
                    result = job.llm.conflict_score(other[0], content)
                    report.record_call(result.stats)
                    if is_conflict(result.score):
                        conflict_id = record_conflict(conn, user_id=owner, a=distillation_id, b=neighbour.id,
                                                      score=result.score)
                        if conflict_id is not None:
                            report.flagged += 1
                            report.ids.append(str(conflict_id))
                            job.alerter.alert("conflict_detected", f"two memories of {owner} contradict each other",
                                              level="warn", ids=(distillation_id, neighbour.id),
                                              error=f"score {result.score:.2f}")
            except LLMError as exc:
                # Leave it unchecked: the next run scores it again once the LLM answers.
                conn.rollback()
                record_error(conn, "conflict_score_failed")
                report.failed += 1
                report.errors.append(f"{distillation_id}: {exc.reason}")
                continue
            conn.execute("UPDATE distillations SET conflict_checked_at = now() WHERE id = %s", (distillation_id,))
            report.rows_out += 1
    return report


def merge_near_duplicates(job: ConsolidateJob, *, user_id: str, day: date | None) -> StageReport:
    """Consolidate each new distillation with its nearest near-duplicate, if any (DESIGN §4).

    The older distillation gets a new version (``merged_from`` the newer one); the newer one
    becomes ``merged``. Never across users, never a pair in conflict, never before the
    distillation's conflict check.
    """
    report = StageReport()
    for distillation_id in _unchecked(job.db, user_id=user_id, day=day, column="dedup_checked_at",
                                      require="conflict_checked_at"):
        report.rows_in += 1
        with job.db.connection() as conn:
            row = _lock_active(conn, distillation_id, "dedup_checked_at")
            if row is None:
                report.skipped += 1
                continue
            _, owner, content, embedding, model, created_at, refreshed_at = row
            neighbours = nearest_active(conn, user_id=owner, embedding=embedding, embedding_model=model,
                                        limit=NEAR_DUPLICATE_TOP_K, exclude_id=distillation_id)
            near = select_near_duplicates(distillation_id, owner, neighbours, conflicting_ids(conn, distillation_id))
            target = choose_merge_target(near)
            if target is not None:
                other = conn.execute(
                    """SELECT id, content, created_at, refreshed_at FROM distillations
                       WHERE id = %s AND status = 'active' AND deleted_at IS NULL FOR UPDATE SKIP LOCKED""",
                    (target.id,),
                ).fetchone()
                if other is None:
                    report.skipped += 1  # being merged elsewhere right now; the next run retries
                    continue
                mine = (distillation_id, content, created_at, refreshed_at)
                older, newer = sorted([mine, tuple(other)], key=lambda r: (r[2], str(r[0])))
                try:
                    merged = job.llm.consolidate(older[1], newer[1])
                    report.record_call(merged.stats)
                    vector = job.embedder.embed_documents([merged.content])[0]
                except (LLMError, EmbeddingError) as exc:
                    conn.rollback()
                    record_error(conn, "consolidation_failed")
                    report.failed += 1
                    report.errors.append(f"{distillation_id}: {getattr(exc, 'reason', exc)}")
                    continue
                add_version(conn, older[0], content=merged.content, embedding=vector,
                            embedding_model=job.embedder.model_name, reason="merged", merged_from=[newer[0]],
                            refreshed_at=max(older[3], newer[3]))
                set_distillation_status(conn, newer[0], status="merged", action="merge")
                conn.execute("UPDATE distillations SET dedup_checked_at = now() WHERE id = ANY(%s::uuid[])",
                             ([str(older[0]), str(newer[0])],))
                report.flagged += 1
                report.ids.append(str(older[0]))
            else:
                conn.execute("UPDATE distillations SET dedup_checked_at = now() WHERE id = %s", (distillation_id,))
            report.rows_out += 1
    return report
