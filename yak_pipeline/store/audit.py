"""The append-only audit log: who did what to which id, never the memory text itself."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Jsonb


def write_audit(
    conn: psycopg.Connection,
    *,
    actor: str,
    action: str,
    target_type: str,
    target_id: object | None,
    user_id: str | None,
    detail: dict[str, Any] | None = None,
) -> None:
    """Append one audit row in the caller's transaction, so it commits with the change it records."""
    conn.execute(
        """INSERT INTO audit_log (user_id, actor, action, target_type, target_id, detail)
           VALUES (%(user_id)s, %(actor)s, %(action)s, %(target_type)s, %(target_id)s, %(detail)s)""",
        {"user_id": user_id, "actor": actor, "action": action, "target_type": target_type,
         "target_id": None if target_id is None else str(target_id), "detail": Jsonb(detail or {})},
    )


def list_audit(conn: psycopg.Connection, *, user_id: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """The latest audit rows, newest first, optionally for one user."""
    rows = conn.execute(
        """SELECT id, user_id, actor, action, target_type, target_id, detail, created_at
           FROM audit_log WHERE (%(user)s::text IS NULL OR user_id = %(user)s)
           ORDER BY id DESC LIMIT %(limit)s""",
        {"user": user_id, "limit": limit},
    ).fetchall()
    keys = ("id", "user_id", "actor", "action", "target_type", "target_id", "detail", "created_at")
    return [dict(zip(keys, row)) for row in rows]
