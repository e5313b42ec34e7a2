"""What a user's memory holds now: the distillations a MEMORY.md lists."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row


def current_knowledge(conn: psycopg.Connection, user_id: str) -> list[dict[str, Any]]:
    """The user's live ``active`` distillations that nothing newer superseded, oldest statement first.

    Left out, as recall treats them: ``review`` rows (never recalled until approved), merged and
    rejected ones, forgotten ones, and those a live newer distillation superseded (a forgotten
    superseder does not count). Ties are broken by id, so the order never changes between reads.
    """
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT d.id, d.content, d.tier, d.confidence, d.needs_review, d.refreshed_at, m.occurred_at
               FROM distillations d JOIN memories m ON m.id = d.memory_id
               WHERE d.user_id = %(user)s AND d.status = 'active' AND d.deleted_at IS NULL
                 AND m.deleted_at IS NULL
                 AND NOT EXISTS (SELECT 1 FROM distillations s
                                 WHERE s.id = d.superseded_by AND s.deleted_at IS NULL)
               ORDER BY d.refreshed_at, d.content, d.id""",
            {"user": user_id},
        ).fetchall()
