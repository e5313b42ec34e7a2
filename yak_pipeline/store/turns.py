"""Turns: the per-turn evaluation queue (which recalled memories were useful)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, date, datetime
from typing import Any, NamedTuple
from uuid import UUID

import psycopg
from psycopg.rows import class_row

from yak_pipeline.core.secrets import redact_secrets
from yak_pipeline.core.types import validate_user_id
from yak_pipeline.store.rows import PendingPartition, claim_pending_rows, live_row, one_value


class TurnToEvaluate(NamedTuple):
    """What evaluating a turn reads of it, under its lock (``store.locking.lock_live_row``)."""

    id: UUID
    user_id: str
    user_message: str
    assistant_message: str
    recalled_ids: list[UUID]
    attempts: int


_COLUMNS = (
    "id, user_id, memory_id, user_message, assistant_message, recalled_ids, status, attempts, last_error, "
    "occurred_at, created_at, evaluated_at"
)


def insert_turn(
    conn: psycopg.Connection,
    *,
    user_id: str,
    user_message: str,
    assistant_message: str,
    recalled_ids: Sequence[UUID | str],
    memory_id: UUID | str | None = None,
    occurred_at: datetime | None = None,
) -> UUID:
    """Queue one turn for evaluation; recalled ids of other users are dropped, never evaluated.

    Its messages are stored with their secrets replaced, as their exchange is (``new_exchange``,
    which refuses or counts them: a turn is always written with its exchange)."""
    validate_user_id(user_id)
    user_message, assistant_message = redact_secrets(user_message).text, redact_secrets(assistant_message).text
    ids = [str(i) for i in recalled_ids]
    # Scope the recalled ids to the user in SQL so a turn can never touch another user's warmth.
    return one_value(
        conn,
        """INSERT INTO turns (user_id, memory_id, user_message, assistant_message, recalled_ids, occurred_at)
           SELECT %(user)s, %(memory)s, %(um)s, %(am)s,
                  coalesce(array_agg(d.id ORDER BY d.id), '{}'), %(at)s
           FROM distillations d WHERE d.id = ANY(%(ids)s::uuid[]) AND d.user_id = %(user)s AND d.deleted_at IS NULL
           RETURNING id""",
        {"user": user_id, "memory": None if memory_id is None else str(memory_id), "um": user_message,
         "am": assistant_message, "ids": ids, "at": occurred_at or datetime.now(UTC)},
        UUID,
    )


def get_turn(conn: psycopg.Connection, turn_id: UUID | str, *, user_id: str | None = None) -> dict[str, Any] | None:
    """One live turn by id; with ``user_id``, only if it is that user's."""
    return live_row(conn, "turns", _COLUMNS, turn_id, user_id=user_id)


def claim_pending_turns(
    conn: psycopg.Connection, *, user_id: str | None = None, day: date | None = None, limit: int = 500
) -> list[dict[str, Any]]:
    """Lock and return pending turns (``SKIP LOCKED``: concurrent workers never share one)."""
    return claim_pending_rows(conn, "turns", _COLUMNS, user_id=user_id, day=day, limit=limit)


def pending_turn_partitions(conn: psycopg.Connection) -> list[PendingPartition]:
    """The partitions with pending turns, for the turns sensor (the signature names the pending
    turns and their attempts, as ``pending_memory_partitions``' does)."""
    with conn.cursor(row_factory=class_row(PendingPartition)) as cur:
        return cur.execute(
            """SELECT user_id, (occurred_at AT TIME ZONE 'UTC')::date AS day, count(*) AS rows,
                      count(*) || '-' || left(md5(string_agg(id::text || ':' || attempts, ',' ORDER BY id)), 16)
                        AS signature
               FROM turns WHERE status = 'pending' AND deleted_at IS NULL GROUP BY 1, 2 ORDER BY 2, 1"""
        ).fetchall()


def mark_turn(conn: psycopg.Connection, turn_id: UUID | str, *, status: str, error: str | None = None) -> None:
    """Record the outcome of evaluating a turn."""
    conn.execute(
        """UPDATE turns SET status = %(status)s, last_error = %(error)s, attempts = attempts + 1,
                  evaluated_at = CASE WHEN %(status)s = 'evaluated' THEN now() ELSE evaluated_at END
           WHERE id = %(turn_id)s""",
        {"status": status, "error": None if error is None else error[:2000], "turn_id": str(turn_id)},
    )


def turn_ids(conn: psycopg.Connection, *, user_id: str | None, day: date | None, since: datetime | None,
             pending_only: bool) -> list[str]:
    """Ids of live turns (of a user, a day, since a moment; only pending ones), oldest first."""
    rows = conn.execute(
        """SELECT id FROM turns
           WHERE deleted_at IS NULL
             AND (%(user)s::text IS NULL OR user_id = %(user)s)
             AND (%(day)s::date IS NULL OR (occurred_at AT TIME ZONE 'UTC')::date = %(day)s)
             AND (%(since)s::timestamptz IS NULL OR occurred_at >= %(since)s)
             AND (status = 'pending' OR NOT %(pending_only)s)
           ORDER BY occurred_at, id""",
        {"user": user_id, "day": day, "since": since, "pending_only": pending_only},
    ).fetchall()
    return [str(r[0]) for r in rows]

