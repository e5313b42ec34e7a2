"""What waits for the pipeline: pending memories and turns, and the items that failed for good."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row


@dataclass(frozen=True)
class QueueCounts:
    """Pending and failed memories (awaiting distillation) and turns (awaiting warmth evaluation),
    and the memories still waiting for a vector (an import's follow in the background)."""

    pending_memories: int
    pending_turns: int
    failed_memories: int
    failed_turns: int
    unembedded_memories: int = 0

    @property
    def pending(self) -> int:
        """Everything still waiting."""
        return self.pending_memories + self.pending_turns


def queue_counts(conn: psycopg.Connection, *, user_id: str | None = None) -> QueueCounts:
    """Counts of live pending and failed memories and turns, optionally for one user, and of the live
    memories still lacking their own vector or their vector in context (sql/004, 008: both counted
    from their partial indexes of the rows without one)."""
    row = conn.execute(
        """SELECT
             (SELECT count(*) FROM memories WHERE status = 'pending' AND deleted_at IS NULL
                AND (%(user)s::text IS NULL OR user_id = %(user)s)),
             (SELECT count(*) FROM turns WHERE status = 'pending' AND deleted_at IS NULL
                AND (%(user)s::text IS NULL OR user_id = %(user)s)),
             (SELECT count(*) FROM memories WHERE status = 'failed' AND deleted_at IS NULL
                AND (%(user)s::text IS NULL OR user_id = %(user)s)),
             (SELECT count(*) FROM turns WHERE status = 'failed' AND deleted_at IS NULL
                AND (%(user)s::text IS NULL OR user_id = %(user)s)),
             (SELECT count(*) FROM memories WHERE (embedding IS NULL OR context_embedding IS NULL)
                AND deleted_at IS NULL AND (%(user)s::text IS NULL OR user_id = %(user)s))""",
        {"user": user_id},
    ).fetchone()
    assert row is not None, "a SELECT without FROM returns its row"
    return QueueCounts(*(int(v) for v in row))


def failed_items(conn: psycopg.Connection, *, user_id: str | None = None, limit: int = 20) -> list[dict[str, Any]]:
    """The latest memories and turns that failed for good (or are retrying), with their last error."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT * FROM (
                 SELECT 'memory' AS kind, id, user_id, status, attempts, last_error, created_at FROM memories
                 WHERE deleted_at IS NULL AND last_error IS NOT NULL AND status <> 'distilled'
                   AND (%(user)s::text IS NULL OR user_id = %(user)s)
                 UNION ALL
                 SELECT 'turn', id, user_id, status, attempts, last_error, created_at FROM turns
                 WHERE deleted_at IS NULL AND last_error IS NOT NULL AND status <> 'evaluated'
                   AND (%(user)s::text IS NULL OR user_id = %(user)s)
               ) failed ORDER BY created_at DESC, id LIMIT %(limit)s""",
            {"user": user_id, "limit": limit},
        ).fetchall()
