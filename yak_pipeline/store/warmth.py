"""Warmth: every change goes through one function that writes the event with it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import psycopg

from yak_pipeline.core.warmth import WARMTH_DEFAULT, WarmthChange, evaluate_warmth
from yak_pipeline.store.audit import write_audit


@dataclass(frozen=True)
class WarmthUpdate:
    """One applied warmth evaluation."""

    distillation_id: UUID
    relevance_score: float | None
    change: WarmthChange


def apply_relevance(
    conn: psycopg.Connection,
    distillation_id: UUID | str,
    *,
    relevance_score: float,
    reason: str,
    turn_id: UUID | str | None = None,
    evaluator: str | None = None,
    user_id: str | None = None,
) -> WarmthUpdate | None:
    """Apply the DESIGN §4 warmth rule for one evaluation and record the event.

    The row is locked so concurrent evaluations of one memory add up instead of overwriting
    each other. Returns None when the distillation does not exist (or is not ``user_id``'s).
    """
    row = conn.execute(
        """SELECT user_id, warmth FROM distillations
           WHERE id = %(id)s AND deleted_at IS NULL AND (%(user)s::text IS NULL OR user_id = %(user)s)
           FOR UPDATE""",
        {"id": str(distillation_id), "user": user_id},
    ).fetchone()
    if row is None:
        return None
    owner, warmth = row
    change = evaluate_warmth(warmth, relevance_score)
    _record(conn, distillation_id, owner, change, relevance_score, reason, turn_id, evaluator)
    return WarmthUpdate(UUID(str(distillation_id)), relevance_score, change)


def _record(
    conn: psycopg.Connection,
    distillation_id: UUID | str,
    user_id: str,
    change: WarmthChange,
    relevance: float | None,
    reason: str,
    turn_id: UUID | str | None,
    evaluator: str | None,
) -> None:
    if change.after != change.before:
        conn.execute("UPDATE distillations SET warmth = %(after)s, updated_at = now() WHERE id = %(distillation_id)s",
                     {"after": change.after, "distillation_id": str(distillation_id)})
    conn.execute(
        """INSERT INTO warmth_events (distillation_id, turn_id, user_id, relevance_score, delta,
                                      warmth_before, warmth_after, reason, evaluator)
           VALUES (%(distillation_id)s, %(turn_id)s, %(user_id)s, %(relevance)s, %(delta)s, %(before)s, %(after)s, %(reason)s, %(evaluator)s)""",
        {"distillation_id": str(distillation_id), "turn_id": None if turn_id is None else str(turn_id),
         "user_id": user_id, "relevance": relevance, "delta": change.delta, "before": change.before,
         "after": change.after, "reason": reason, "evaluator": evaluator},
    )


def reset_warmth(
    conn: psycopg.Connection,
    distillation_ids: Sequence[UUID | str] | None = None,
    *,
    user_id: str | None = None,
    actor: str = "system",
) -> int:
    """Set warmth back to the default (0.5) for the given ids, or all of a user's; returns rows changed."""
    if distillation_ids is None and user_id is None:
        raise ValueError("reset_warmth needs ids or a user")
    rows = conn.execute(
        """SELECT id, user_id, warmth FROM distillations
           WHERE deleted_at IS NULL AND warmth <> %(default)s
             AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))
             AND (%(user)s::text IS NULL OR user_id = %(user)s)
           FOR UPDATE""",
        {"default": WARMTH_DEFAULT, "ids": None if distillation_ids is None else [str(i) for i in distillation_ids],
         "user": user_id},
    ).fetchall()
    for distillation_id, owner, warmth in rows:
        change = WarmthChange(before=warmth, delta=WARMTH_DEFAULT - warmth, after=WARMTH_DEFAULT)
        _record(conn, distillation_id, owner, change, None, "reset", None, actor)
    write_audit(conn, actor=actor, action="warmth_reset", target_type="distillation",
                target_id=None if len(rows) != 1 else rows[0][0], user_id=user_id,
                detail={"count": len(rows)})
    return len(rows)


def undo_turn_warmth(conn: psycopg.Connection, *, user_id: str, memory_ids: Sequence[str],
                     keep_out: Sequence[str] = (), actor: str = "forget") -> int:
    """Move back the warmth that the turns stored from ``memory_ids`` caused; the memories changed.

    Forgetting a turn forgets its evaluations too (their events go with it), so each memory they
    warmed or cooled gets the sum of their deltas taken back, within [0, 1], recorded as one
    event with reason ``forgotten`` (sql/009). ``keep_out``: distillations being forgotten in the
    same operation (nothing to undo on a row that goes). Call it before the turns are deleted.
    """
    rows = conn.execute(
        """SELECT d.id, d.warmth, sum(e.delta)
           FROM warmth_events e
           JOIN turns t ON t.id = e.turn_id
           JOIN distillations d ON d.id = e.distillation_id
           WHERE t.memory_id = ANY(%(memories)s::uuid[]) AND t.user_id = %(user)s AND t.deleted_at IS NULL
             AND d.deleted_at IS NULL AND NOT (d.id = ANY(%(keep_out)s::uuid[]))
           GROUP BY d.id, d.warmth
           ORDER BY d.id""",
        {"memories": list(memory_ids), "user": user_id, "keep_out": list(keep_out)},
    ).fetchall()
    changed = 0
    for distillation_id, warmth, delta in rows:
        after = min(1.0, max(0.0, warmth - delta))
        if after == warmth:
            continue
        conn.execute("SELECT 1 FROM distillations WHERE id = %(distillation_id)s FOR UPDATE", {"distillation_id": str(distillation_id)})
        _record(conn, distillation_id, user_id, WarmthChange(before=warmth, delta=after - warmth, after=after), None,
                "forgotten", None, actor)
        changed += 1
    return changed


def warmth_history(conn: psycopg.Connection, distillation_id: UUID | str, *, limit: int = 50) -> list[dict[str, Any]]:
    """A distillation's latest warmth events, newest first."""
    rows = conn.execute(
        """SELECT id, turn_id, relevance_score, delta, warmth_before, warmth_after, reason, evaluator, created_at
           FROM warmth_events WHERE distillation_id = %(distillation_id)s ORDER BY id DESC LIMIT %(limit)s""",
        {"distillation_id": str(distillation_id), "limit": limit},
    ).fetchall()
    keys = ("id", "turn_id", "relevance_score", "delta", "warmth_before", "warmth_after", "reason", "evaluator",
            "created_at")
    return [dict(zip(keys, r)) for r in rows]


def evaluated_distillations(conn: psycopg.Connection, turn_id: UUID | str) -> set[str]:
    """Ids of the distillations that already have a warmth event for this turn (each pair counts once)."""
    return {str(r[0]) for r in conn.execute(
        "SELECT distillation_id FROM warmth_events WHERE turn_id = %(turn_id)s", {"turn_id": str(turn_id)}).fetchall()}
