"""How far each grown-over-time history file (a Claude Code session) has been read (sql/011)."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg


@dataclass(frozen=True)
class ImportCursor:
    """Where the next read of a source starts, if its first ``resume_at`` bytes still hash the same."""

    resume_at: int
    prefix_sha256: str


def get_import_cursor(conn: psycopg.Connection, user_id: str, source_key: str) -> ImportCursor | None:
    """The cursor of ``source_key`` for ``user_id``, or None if it was never imported."""
    row = conn.execute("SELECT resume_at, prefix_sha256 FROM import_cursors WHERE user_id = %(user_id)s AND source_key = %(source_key)s",
                       {"user_id": user_id, "source_key": source_key}).fetchone()
    return ImportCursor(row[0], row[1]) if row else None


def save_import_cursor(conn: psycopg.Connection, user_id: str, source_key: str, cursor: ImportCursor) -> None:
    """Record where the next read of ``source_key`` starts."""
    conn.execute(
        """INSERT INTO import_cursors (user_id, source_key, resume_at, prefix_sha256) VALUES (%(user_id)s, %(source_key)s, %(resume_at)s, %(prefix_sha256)s)
           ON CONFLICT (user_id, source_key) DO UPDATE
               SET resume_at = EXCLUDED.resume_at, prefix_sha256 = EXCLUDED.prefix_sha256, updated_at = now()""",
        {"user_id": user_id, "source_key": source_key, "resume_at": cursor.resume_at,
         "prefix_sha256": cursor.prefix_sha256},
    )
