"""Read-only summaries for the web page: who has memories, what one user's memory holds, what changed lately."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from yak_pipeline.store.knowledge import ACTIVE_MEMORY_SQL


def list_users(conn: psycopg.Connection, *, limit: int = 500) -> list[dict[str, Any]]:
    """Users with live memories (Yak has no user registry), with their counts, most recent first."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT m.user_id, count(*) AS memories, max(m.occurred_at) AS last_exchange,
                      (SELECT count(*) FROM distillations d WHERE d.user_id = m.user_id
                         AND """ + ACTIVE_MEMORY_SQL + """) AS active_memories
               FROM memories m WHERE m.deleted_at IS NULL
               GROUP BY m.user_id ORDER BY max(m.occurred_at) DESC, m.user_id LIMIT %(limit)s""",
            {"limit": limit},
        ).fetchall()


def user_counts(conn: psycopg.Connection, user_id: str) -> dict[str, int]:
    """One user's memory at a glance: memories and distillations by status, flags, conflicts, pins, versions.

    ``active`` is :data:`~yak_pipeline.store.knowledge.ACTIVE_MEMORY_SQL` (what MEMORY.md lists);
    ``superseded`` counts the active rows a newer memory replaced, which it leaves out."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            """SELECT
                 (SELECT count(*) FROM memories WHERE user_id = %(u)s AND deleted_at IS NULL) AS memories,
                 (SELECT count(*) FROM memories WHERE user_id = %(u)s AND deleted_at IS NULL
                    AND status = 'pending') AS pending_memories,
                 (SELECT count(*) FROM memories WHERE user_id = %(u)s AND deleted_at IS NULL
                    AND status = 'failed') AS failed_memories,
                 (SELECT count(*) FROM distillations d WHERE d.user_id = %(u)s
                    AND """ + ACTIVE_MEMORY_SQL + """) AS active,
                 (SELECT count(*) FROM distillations d WHERE d.user_id = %(u)s AND d.status = 'active'
                    AND d.deleted_at IS NULL AND EXISTS (SELECT 1 FROM distillations s
                      WHERE s.id = d.superseded_by AND s.deleted_at IS NULL)) AS superseded,
                 (SELECT count(*) FROM distillations WHERE user_id = %(u)s AND deleted_at IS NULL
                    AND (needs_review OR status = 'review') AND status IN ('active', 'review')) AS to_review,
                 (SELECT count(*) FROM distillations WHERE user_id = %(u)s AND deleted_at IS NULL
                    AND status = 'rejected') AS rejected,
                 (SELECT count(*) FROM distillations WHERE user_id = %(u)s AND deleted_at IS NULL
                    AND status = 'merged') AS merged,
                 (SELECT count(*) FROM distillations WHERE user_id = %(u)s AND deleted_at IS NULL
                    AND user_weight <> 1.0) AS pinned,
                 (SELECT count(*) FROM conflicts WHERE user_id = %(u)s AND status = 'open') AS open_conflicts,
                 (SELECT count(*) FROM distillation_versions v JOIN distillations d ON d.id = v.distillation_id
                    WHERE d.user_id = %(u)s AND d.deleted_at IS NULL AND v.deleted_at IS NULL) AS versions""",
            {"u": user_id},
        ).fetchone()
    assert row is not None, "a SELECT without FROM returns its row"
    return {k: int(v) for k, v in row.items()}


def recent_distillations(conn: psycopg.Connection, user_id: str, *, limit: int = 30) -> list[dict[str, Any]]:
    """The user's latest changed distillations, with how many versions each has, why the last one
    was written, every distillation merged into it, the live newer one that superseded it (if
    any) and whether it is a side of an open conflict."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT d.id, d.memory_id, d.content, d.confidence, d.tier, d.warmth, d.user_weight, d.status,
                      d.needs_review, d.updated_at, m.occurred_at, d.memory_type, d.event_on,
                      (SELECT s.id FROM distillations s WHERE s.id = d.superseded_by AND s.deleted_at IS NULL)
                        AS superseded_by,
                      EXISTS (SELECT 1 FROM conflicts c WHERE c.status = 'open'
                                AND d.id IN (c.distillation_a, c.distillation_b)) AS in_conflict,
                      count(v.id) AS version_count,
                      (array_agg(v.reason ORDER BY v.version DESC))[1] AS last_reason,
                      coalesce((SELECT array_agg(DISTINCT f) FROM distillation_versions mv, unnest(mv.merged_from) f
                                WHERE mv.distillation_id = d.id AND mv.deleted_at IS NULL), '{}') AS merged_from
               FROM distillations d
               JOIN memories m ON m.id = d.memory_id
               LEFT JOIN distillation_versions v ON v.distillation_id = d.id AND v.deleted_at IS NULL
               WHERE d.user_id = %(u)s AND d.deleted_at IS NULL
               GROUP BY d.id, m.occurred_at
               ORDER BY d.updated_at DESC, d.id LIMIT %(limit)s""",
            {"u": user_id, "limit": limit},
        ).fetchall()

