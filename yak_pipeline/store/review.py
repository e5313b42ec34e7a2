"""The review queue: distillations a person should look at, and their decisions (DESIGN §4).

Flagged means ``status = 'review'`` (confidence under 0.6: stored, never recalled) or
``needs_review`` on an active one (confidence 0.6–0.8, or one side of a conflict).
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple
from uuid import UUID

import psycopg
from psycopg.rows import class_row, dict_row

from yak_pipeline.core.gates import ACTIVE_CONFIDENCE
from yak_pipeline.store.audit import write_audit

_FLAGGED = "deleted_at IS NULL AND status IN ('active', 'review') AND (needs_review OR status = 'review')"

ReviewOutcome = Literal["approved", "rejected", "not_found", "not_flagged"]


def list_review_queue(
    conn: psycopg.Connection, *, user_id: str | None = None, limit: int = 50, offset: int = 0
) -> list[dict[str, Any]]:
    """Flagged distillations, oldest first (the order a person works through them), each with
    whether it is a side of an open conflict and the live newer distillation that superseded it."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            f"""SELECT id, memory_id, user_id, content, confidence, tier, warmth, status, needs_review, created_at,
                       memory_type, event_on,
                       EXISTS (SELECT 1 FROM conflicts c WHERE c.status = 'open'
                               AND (c.distillation_a = d.id OR c.distillation_b = d.id)) AS in_conflict,
                       (SELECT s.id FROM distillations s WHERE s.id = d.superseded_by AND s.deleted_at IS NULL)
                         AS superseded_by
                FROM distillations d
                WHERE {_FLAGGED} AND (%(user)s::text IS NULL OR user_id = %(user)s)
                ORDER BY created_at, id LIMIT %(limit)s OFFSET %(offset)s""",  # noqa: S608 - constant filter
            {"user": user_id, "limit": limit, "offset": offset},
        ).fetchall()


class _UnderReview(NamedTuple):
    """What a review decision reads of the distillation, under its lock."""

    user_id: str
    status: str
    needs_review: bool
    confidence: float


def _lock_for_review(conn: psycopg.Connection, distillation_id: UUID | str, user_id: str | None) -> _UnderReview | None:
    with conn.cursor(row_factory=class_row(_UnderReview)) as cur:
        return cur.execute(
            """SELECT user_id, status, needs_review, confidence FROM distillations
               WHERE id = %(id)s AND deleted_at IS NULL AND (%(user)s::text IS NULL OR user_id = %(user)s)
               FOR UPDATE""",
            {"id": str(distillation_id), "user": user_id},
        ).fetchone()


def _lock_flagged(conn: psycopg.Connection, distillation_id: UUID | str, user_id: str | None) -> _UnderReview | ReviewOutcome:
    """The locked row of a distillation awaiting review, or why there is none (``not_found``, ``not_flagged``)."""
    row = _lock_for_review(conn, distillation_id, user_id)
    if row is None:
        return "not_found"
    if row.status not in ("active", "review") or not (row.needs_review or row.status == "review"):
        return "not_flagged"
    return row


def approve_distillation(
    conn: psycopg.Connection, distillation_id: UUID | str, *, user_id: str | None = None, actor: str = "system"
) -> ReviewOutcome:
    """A person confirms a flagged distillation: it becomes active and leaves the queue.

    A distillation held back under the 0.6 gate gets confidence 0.8 (the active gate): a
    person's confirmation is what that confidence stands for, and the database never allows an
    active row under the gate. The audit row keeps the model's original confidence.
    """
    row = _lock_flagged(conn, distillation_id, user_id)
    if isinstance(row, str):
        return row
    owner, status, confidence = row.user_id, row.status, row.confidence
    conn.execute(
        """UPDATE distillations SET status = 'active', needs_review = false,
                  confidence = greatest(confidence, %(confidence)s), updated_at = now() WHERE id = %(distillation_id)s""",
        {"confidence": ACTIVE_CONFIDENCE if status == "review" else 0.0, "distillation_id": str(distillation_id)},
    )
    write_audit(conn, actor=actor, action="approve", target_type="distillation", target_id=distillation_id,
                user_id=owner, detail={"previous_status": status, "confidence": confidence})
    return "approved"


def reject_distillation(
    conn: psycopg.Connection, distillation_id: UUID | str, *, user_id: str | None = None, actor: str = "system"
) -> ReviewOutcome:
    """A person turns a flagged distillation down: it is kept (with its versions) but never recalled."""
    row = _lock_flagged(conn, distillation_id, user_id)
    if isinstance(row, str):
        return row
    owner, status = row.user_id, row.status
    conn.execute(
        "UPDATE distillations SET status = 'rejected', needs_review = false, updated_at = now() WHERE id = %(distillation_id)s",
        {"distillation_id": str(distillation_id)},
    )
    write_audit(conn, actor=actor, action="reject", target_type="distillation", target_id=distillation_id,
                user_id=owner, detail={"previous_status": status})
    return "rejected"
