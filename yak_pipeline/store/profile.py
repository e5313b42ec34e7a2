"""The profile's rows (sql/016): each exchange's instructions and preferences, as the user said them.

They are written with their exchange (``store.memories.insert_memory``, and again when an exchange
grows), read for the memory block by :func:`profile_lines`, and live and die with the exchange: a
forgotten exchange's lines are not read (soft) or are gone (hard, the cascade). A user can drop a
line from the profile (:func:`set_profile_line_status`): the exchange stays a memory, recallable.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

from yak_pipeline.core.exchanges import users_words
from yak_pipeline.core.profile import ProfileLine, profile_statements
from yak_pipeline.store.audit import write_audit

PROFILE_LINE_STATUSES = ("active", "dropped")


def write_profile_lines(conn: psycopg.Connection, *, memory_id: UUID | str, user_id: str, content: str,
                        fresh: bool = False) -> int:
    """(Re)write the profile lines of one exchange from its text (the user's side of it); how many.

    ``fresh``: the exchange was just inserted (it has no lines yet; most exchanges state none, and
    then this costs no statement). A line the user dropped stays dropped when the same sentence is
    read again."""
    return _write_lines(conn, [(memory_id, user_id, content)], fresh=fresh)[0]


def write_fresh_profile_lines(conn: psycopg.Connection, exchanges: Sequence[tuple[UUID | str, str, str]]) -> int:
    """:func:`write_profile_lines` for many just-inserted ``(memory_id, user_id, content)`` at once
    (an import's batch): one statement for all their lines; how many lines."""
    return sum(_write_lines(conn, exchanges, fresh=True))


def _write_lines(conn: psycopg.Connection, exchanges: Sequence[tuple[UUID | str, str, str]], *,
                 fresh: bool = False) -> list[int]:
    """:func:`write_profile_lines` for many ``(memory_id, user_id, content)`` at once: one read of the
    dropped lines, one delete and one insert for them all; how many lines each has."""
    found = [profile_statements(users_words(content)[0]) for _, _, content in exchanges]
    dropped: set[tuple[str, str]] = set()
    if not fresh and exchanges:
        ids = [str(memory_id) for memory_id, _, _ in exchanges]
        dropped = {(r[0], r[1]) for r in conn.execute(
            """SELECT memory_id::text, content FROM profile_lines
                WHERE memory_id = ANY(%(ids)s::uuid[]) AND status = 'dropped'""", {"ids": ids}).fetchall()}
        conn.execute("DELETE FROM profile_lines WHERE memory_id = ANY(%(ids)s::uuid[])", {"ids": ids})
    rows = [{"memory_id": memory_id, "user_id": user_id, "kind": s.kind, "content": s.text, "position": s.position,
             "status": "dropped" if (str(memory_id), s.text) in dropped else "active"}
            for (memory_id, user_id, _), statements in zip(exchanges, found) for s in statements]
    if rows:
        with conn.cursor() as cur:
            cur.executemany(
                """INSERT INTO profile_lines (memory_id, user_id, kind, content, position, status)
                   VALUES (%(memory_id)s, %(user_id)s, %(kind)s, %(content)s, %(position)s, %(status)s)""", rows)
    return [len(statements) for statements in found]


def rebuild_profile_lines(conn: psycopg.Connection, *, user_id: str | None = None, batch: int = 2000) -> int:
    """Read every live exchange (of ``user_id``, or everyone) again for its profile lines; how many
    exchanges hold one. Used when the profile table first appears (the migration), after a restore,
    and by ``yak profile rebuild`` when the patterns change. A batch of exchanges at a time, each
    batch's lines rewritten with three statements."""
    found = 0
    last = None
    while True:
        rows = conn.execute(
            """SELECT id, user_id, content FROM memories
                WHERE deleted_at IS NULL AND (%(user)s::text IS NULL OR user_id = %(user)s)
                  AND (%(last)s::uuid IS NULL OR id > %(last)s::uuid)
                ORDER BY id LIMIT %(batch)s""",
            {"user": user_id, "last": last, "batch": batch}).fetchall()
        if not rows:
            return found
        found += sum(1 for count in _write_lines(conn, rows) if count)
        last = rows[-1][0]


def profile_lines(conn: psycopg.Connection, user_id: str, *, as_of: datetime | None = None,
                  include_dropped: bool = False) -> list[ProfileLine]:
    """The user's profile lines of live exchanges (said by ``as_of`` when given), newest first."""
    rows = conn.execute(
        """SELECT p.id::text, p.memory_id::text, p.kind, p.content, m.occurred_at, p.status
             FROM profile_lines p JOIN memories m ON m.id = p.memory_id
            WHERE p.user_id = %(user)s AND m.deleted_at IS NULL
              AND (%(dropped)s OR p.status = 'active')
              AND (%(as_of)s::timestamptz IS NULL OR m.occurred_at <= %(as_of)s)
            ORDER BY m.occurred_at DESC, p.position""",
        {"user": user_id, "as_of": as_of, "dropped": include_dropped}).fetchall()
    return [ProfileLine(id=r[0], memory_id=r[1], kind=r[2], text=r[3], said_at=r[4], dropped=r[5] == "dropped")
            for r in rows]


def get_profile_line(conn: psycopg.Connection, line_id: UUID | str, *, user_id: str) -> dict[str, Any] | None:
    """One of the user's profile lines (of a live exchange) by id, or None."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT p.id::text AS id, p.memory_id::text AS memory_id, p.kind, p.content, p.status,
                      m.occurred_at AS said_at
                 FROM profile_lines p JOIN memories m ON m.id = p.memory_id
                WHERE p.id = %(line_id)s AND p.user_id = %(user_id)s AND m.deleted_at IS NULL""",
            {"line_id": str(line_id), "user_id": user_id}).fetchone()


def set_profile_line_status(conn: psycopg.Connection, line_ids: Sequence[UUID | str], *, user_id: str, status: str,
                            actor: str) -> list[str]:
    """Drop lines from the user's profile, or take them back (``status``); the ids changed, audited."""
    if status not in PROFILE_LINE_STATUSES:
        raise ValueError(f"unknown profile line status {status!r}")
    rows = conn.execute(
        """UPDATE profile_lines p SET status = %(status)s, updated_at = now()
             FROM memories m
            WHERE p.id = ANY(%(line_ids)s::uuid[]) AND p.user_id = %(user_id)s AND m.id = p.memory_id AND m.deleted_at IS NULL
              AND p.status <> %(status)s
        RETURNING p.id::text""",
        {"status": status, "line_ids": [str(i) for i in line_ids], "user_id": user_id}).fetchall()
    changed = [r[0] for r in rows]
    for line_id in changed:
        write_audit(conn, actor=actor, action="profile_drop" if status == "dropped" else "profile_keep",
                    target_type="profile_line", target_id=line_id, user_id=user_id, detail={"status": status})
    return changed
