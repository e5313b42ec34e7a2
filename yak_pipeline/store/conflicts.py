"""Conflicts: pairs of a user's distillations that contradict each other."""

from __future__ import annotations

from typing import Any, Literal
from uuid import UUID

import psycopg
from psycopg.rows import dict_row, scalar_row

from yak_pipeline.store.audit import write_audit
from yak_pipeline.store.distillations import flag_for_review, mark_superseded_by_newer, set_distillation_status
from yak_pipeline.store.review import approve_distillation

ConflictKeep = Literal["a", "b", "both"]


def record_conflict(
    conn: psycopg.Connection, *, user_id: str, a: UUID | str, b: UUID | str, score: float, actor: str = "pipeline"
) -> UUID | None:
    """Store a conflict between two of a user's distillations and flag both for review.

    The one stated earlier is marked superseded by the later one (a knowledge update; both stay
    recallable and flagged until a person resolves the conflict). The pair is stored in a fixed
    order so (a, b) and (b, a) are one conflict; returns None when it was already recorded.
    """
    first, second = sorted((str(a), str(b)))
    if first == second:
        raise ValueError("a distillation cannot conflict with itself")
    with conn.cursor(row_factory=scalar_row) as cur:
        conflict_id: UUID | None = cur.execute(
            """INSERT INTO conflicts (user_id, distillation_a, distillation_b, score) VALUES (%(user_id)s, %(first)s, %(second)s, %(score)s)
               ON CONFLICT (distillation_a, distillation_b) DO NOTHING RETURNING id""",
            {"user_id": user_id, "first": first, "second": second, "score": score},
        ).fetchone()
    if conflict_id is None:
        return None
    flag_for_review(conn, [first, second])
    mark_superseded_by_newer(conn, first, second, actor=actor, user_id=user_id)
    write_audit(conn, actor=actor, action="conflict", target_type="conflict", target_id=conflict_id, user_id=user_id,
                detail={"a": first, "b": second, "score": score})
    return conflict_id


def conflicting_ids(conn: psycopg.Connection, distillation_id: UUID | str) -> set[str]:
    """Ids of the distillations in an open conflict with this one (never merged with it)."""
    rows = conn.execute(
        """SELECT CASE WHEN distillation_a = %(id)s THEN distillation_b ELSE distillation_a END
           FROM conflicts WHERE status = 'open' AND (distillation_a = %(id)s OR distillation_b = %(id)s)""",
        {"id": str(distillation_id)},
    ).fetchall()
    return {str(r[0]) for r in rows}


def open_conflicts_of(conn: psycopg.Connection, distillation_id: UUID | str) -> list[dict[str, Any]]:
    """The open conflicts one distillation is a side of, with the other side's text and when it was said."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT c.id, c.score, o.id AS other_id, o.content AS other_content, om.occurred_at AS other_said_at
               FROM conflicts c
               JOIN distillations o ON o.id = CASE WHEN c.distillation_a = %(id)s THEN c.distillation_b
                                                   ELSE c.distillation_a END AND o.deleted_at IS NULL
               JOIN memories om ON om.id = o.memory_id
               WHERE c.status = 'open' AND (c.distillation_a = %(id)s OR c.distillation_b = %(id)s)""",
            {"id": str(distillation_id)},
        ).fetchall()


def list_conflicts(
    conn: psycopg.Connection, *, user_id: str | None = None, status: str | None = "open", limit: int = 50
) -> list[dict[str, Any]]:
    """Conflicts with both sides' text and when each was said (``said_a``, ``said_b``: its
    exchange's time, as supersession judges "newer"), newest first; hides pairs with a forgotten side."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT c.id, c.user_id, c.distillation_a, a.content AS content_a, c.distillation_b,
                      b.content AS content_b, c.score, c.status, c.resolution, c.created_at, c.resolved_at,
                      ma.occurred_at AS said_a, mb.occurred_at AS said_b
               FROM conflicts c
               JOIN distillations a ON a.id = c.distillation_a AND a.deleted_at IS NULL
               JOIN distillations b ON b.id = c.distillation_b AND b.deleted_at IS NULL
               JOIN memories ma ON ma.id = a.memory_id
               JOIN memories mb ON mb.id = b.memory_id
               WHERE (%(user)s::text IS NULL OR c.user_id = %(user)s)
                 AND (%(status)s::text IS NULL OR c.status = %(status)s)
               ORDER BY c.created_at DESC LIMIT %(limit)s""",
            {"user": user_id, "status": status, "limit": limit},
        ).fetchall()


def close_conflict(
    conn: psycopg.Connection,
    conflict_id: UUID | str,
    *,
    status: str,
    keep: ConflictKeep | None = None,
    resolution: str | None = None,
    user_id: str | None = None,
    actor: str = "system",
) -> bool:
    """Resolve or dismiss an open conflict; False when no such open conflict (for that user).

    Resolved with ``keep``, it is settled by a person's choice: side ``a`` or ``b`` is confirmed (as
    a review approval) and the other is rejected, kept with its versions but never recalled (so it
    no longer supersedes the kept one either); ``both``: both sides are confirmed, e.g. a preference
    that changed over time. The resolution is then ``resolution`` or a note naming the choice; every
    step is audited.
    """
    if status not in ("resolved", "dismissed"):
        raise ValueError(f"a conflict closes as resolved or dismissed, not {status!r}")
    if keep is not None:
        if status != "resolved":
            raise ValueError(f"a conflict settled by keeping a side is resolved, not {status!r}")
        kept = _keep_sides(conn, conflict_id, keep, user_id=user_id, actor=actor)
        if kept is None:
            return False
        resolution = resolution or kept
    row = conn.execute(
        """UPDATE conflicts SET status = %(status)s, resolution = %(resolution)s, resolved_at = now()
           WHERE id = %(id)s AND status = 'open' AND (%(user)s::text IS NULL OR user_id = %(user)s)
           RETURNING user_id""",
        {"status": status, "resolution": resolution, "id": str(conflict_id), "user": user_id},
    ).fetchone()
    if row is None:
        return False
    write_audit(conn, actor=actor, action=f"conflict_{status}", target_type="conflict", target_id=conflict_id,
                user_id=row[0], detail={"resolution": resolution})
    return True


def _keep_sides(conn: psycopg.Connection, conflict_id: UUID | str, keep: ConflictKeep, *, user_id: str | None,
                actor: str) -> str | None:
    """Confirm the side(s) of an open conflict that ``keep`` names and reject the other, its row locked
    until the caller's transaction ends; the note naming the choice, or None when there is no such
    open conflict (for that user)."""
    if keep not in ("a", "b", "both"):
        raise ValueError(f"keep side a, side b or both, not {keep!r}")
    row = conn.execute(
        """SELECT distillation_a, distillation_b FROM conflicts
           WHERE id = %(id)s AND status = 'open' AND (%(user)s::text IS NULL OR user_id = %(user)s) FOR UPDATE""",
        {"id": str(conflict_id), "user": user_id},
    ).fetchone()
    if row is None:
        return None
    sides = {"a": str(row[0]), "b": str(row[1])}
    kept = list(sides.values()) if keep == "both" else [sides[keep]]
    for distillation_id in kept:
        # "not_flagged" (already approved by someone) is fine: the side stays as it is.
        approve_distillation(conn, distillation_id, user_id=user_id, actor=actor)
    for distillation_id in set(sides.values()) - set(kept):
        set_distillation_status(conn, distillation_id, status="rejected", needs_review=False, actor=actor,
                                action="reject")
    return "kept both" if keep == "both" else f"kept {sides[keep]}"
