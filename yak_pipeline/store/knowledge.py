"""What a user's memory holds now: the distillations a MEMORY.md lists, and the one definition
of an "active memory" every count uses (the Users page, a user's overview, MEMORY.md)."""

from __future__ import annotations

from typing import Any, Final

import psycopg
from psycopg.rows import dict_row

# An "active memory": a live ``active`` distillation (alias ``d``) whose exchange is live and that no
# live newer distillation superseded (a forgotten superseder does not count). The Users page once
# counted every ``active`` row (9) while MEMORY.md left the superseded one out (8): every count of
# active memories now uses this condition, so they agree. Superseded rows stay recallable (a
# question about the past may need them); they are counted apart, as superseded.
ACTIVE_MEMORY_SQL: Final[str] = """d.status = 'active' AND d.deleted_at IS NULL
  AND EXISTS (SELECT 1 FROM memories am WHERE am.id = d.memory_id AND am.deleted_at IS NULL)
  AND NOT EXISTS (SELECT 1 FROM distillations asup WHERE asup.id = d.superseded_by AND asup.deleted_at IS NULL)"""


def current_knowledge(conn: psycopg.Connection, user_id: str) -> list[dict[str, Any]]:
    """The user's live ``active`` distillations that nothing newer superseded, oldest statement first.

    Left out, as recall treats them: ``review`` rows (never recalled until approved), merged and
    rejected ones, forgotten ones, and those a live newer distillation superseded (a forgotten
    superseder does not count). Ties are broken by id, so the order never changes between reads.
    """
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT d.id, d.content, d.tier, d.confidence, d.needs_review, d.refreshed_at, m.occurred_at,
                      d.memory_type, d.event_on
               FROM distillations d JOIN memories m ON m.id = d.memory_id
               WHERE d.user_id = %(user)s AND """ + ACTIVE_MEMORY_SQL + """
               ORDER BY d.refreshed_at, d.content, d.id""",
            {"user": user_id},
        ).fetchall()
