"""The consolidation stages' "checked once" markers on distillations (sql/001): which stage has seen which.

The conflict and dedup stages each check an active distillation once: they find the unchecked
ones of a partition, lock one at a time, and mark it checked (``services.consolidate``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime
from typing import Any, NamedTuple
from uuid import UUID

import psycopg

from yak_pipeline.store.locking import lock_live_row

# The consolidation stages' "checked once" markers (sql/001): which stage has seen a distillation.
CHECK_COLUMNS = ("conflict_checked_at", "dedup_checked_at")


class CheckedDistillation(NamedTuple):
    """What the consolidation stages read of the distillation they check."""

    id: UUID
    user_id: str
    content: str
    # An active distillation always has both (sql/001's check): a numpy vector (pgvector's loader).
    embedding: Any
    embedding_model: str
    created_at: datetime
    refreshed_at: datetime


class MergeTarget(NamedTuple):
    """A side of a near-duplicate merge: which distillation, its text, and its times."""

    id: UUID | str
    content: str
    created_at: datetime
    refreshed_at: datetime


def _check_column(column: str) -> str:
    """``column`` when it is one of :data:`CHECK_COLUMNS`: it goes into the SQL by name."""
    if column not in CHECK_COLUMNS:
        raise ValueError(f"unknown check column {column!r}")
    return column


def unchecked_distillations(conn: psycopg.Connection, *, user_id: str, day: date | None, column: str,
                            require: str | None = None) -> list[str]:
    """Active distillations of a partition not yet checked by ``column`` (and checked by ``require``), oldest first."""
    column = _check_column(column)
    extra = f" AND d.{_check_column(require)} IS NOT NULL" if require else ""
    rows = conn.execute(
        f"""SELECT d.id FROM distillations d JOIN memories m ON m.id = d.memory_id
            WHERE d.user_id = %(user)s AND d.status = 'active' AND d.deleted_at IS NULL
              AND d.{column} IS NULL{extra}
              AND (%(day)s::date IS NULL OR (m.occurred_at AT TIME ZONE 'UTC')::date = %(day)s)
            ORDER BY d.created_at, d.id""",  # noqa: S608 - column names are checked against CHECK_COLUMNS
        {"user": user_id, "day": day},
    ).fetchall()
    return [str(r[0]) for r in rows]


def lock_unchecked(conn: psycopg.Connection, distillation_id: UUID | str, column: str, *,
                   lock: bool = True) -> CheckedDistillation | None:
    """Lock an active distillation still unchecked by ``column``; None when gone, held or done.

    ``lock=False`` only reads it (the merge stage's look-ahead).
    """
    return lock_live_row(conn, "distillations", distillation_id, CheckedDistillation, where={"status": "active"},
                         unset=(_check_column(column),), lock=lock)


def lock_merge_target(conn: psycopg.Connection, distillation_id: UUID | str, *, lock: bool) -> MergeTarget | None:
    """An active distillation about to absorb or be absorbed."""
    return lock_live_row(conn, "distillations", distillation_id, MergeTarget,
                         where={"status": "active"}, lock=lock)


def mark_checked(conn: psycopg.Connection, distillation_ids: Sequence[UUID | str], column: str) -> None:
    """Record that a consolidation stage has checked these distillations (``column`` = now)."""
    conn.execute(
        f"UPDATE distillations SET {_check_column(column)} = now() WHERE id = ANY(%(ids)s::uuid[])",  # noqa: S608
        {"ids": [str(i) for i in distillation_ids]},
    )
