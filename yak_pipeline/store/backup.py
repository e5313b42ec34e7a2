"""Rows of one user (or all) out of the database and back in, for ``yak export --format jsonl`` / ``yak restore``.

A row travels as the JSON PostgreSQL makes of it (``to_jsonb``), and comes back through
``jsonb_populate_record``, so every column keeps its exact value: timestamps to the
microsecond, doubles and vectors in their shortest exact text. The columns are read from the
catalogue, so a column a later migration adds travels too. Left out:

- columns the database computes (generated columns, ``memories.seq``, the conversation context
  ``memories.context_tsv`` that the trigger of sql/006 rebuilds as the rows arrive);
- ``api_keys.key_hash``: a backup never holds anything that lets a key in;
- forgotten rows (``deleted_at`` set), and rows hanging on them.

Restoring keeps every uuid. ``warmth_events`` get new serial ids (their order is kept).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Final

import psycopg
from psycopg import sql

from yak_pipeline.store.rows import one_value

# In the order they are written and restored: every row after the rows it references.
BACKUP_TABLES: Final[tuple[str, ...]] = (
    "memories", "distillations", "distillation_versions", "conflicts", "turns", "warmth_events", "api_keys")
# Tables whose uuid ``id`` a restore keeps, and so must not find in the database already.
KEYED_TABLES: Final[tuple[str, ...]] = ("memories", "distillations", "distillation_versions", "conflicts", "turns")
# Not restored: a key without its hash cannot be used; the backup lists keys for reference only.
REFERENCE_ONLY_TABLES: Final = frozenset({"api_keys"})
_LEFT_OUT: Final[dict[str, frozenset[str]]] = {
    "memories": frozenset({"context_tsv"}),
    "api_keys": frozenset({"key_hash"}),
}
# Written once every row is in: the sql/006 trigger clears a context vector whenever an
# exchange's neighbours change (they arrive one by one), and superseded_by may point forward.
DEFERRED_COLUMNS: Final[dict[str, tuple[str, ...]]] = {
    "memories": ("context_embedding", "context_embedding_model"),
    "distillations": ("superseded_by",),
}
# Serial surrogate keys: given anew on restore.
_RENUMBERED: Final[dict[str, frozenset[str]]] = {"warmth_events": frozenset({"id"})}

_LIVE_MEMORY: Final = "EXISTS (SELECT 1 FROM memories lm WHERE lm.id = {ref} AND lm.deleted_at IS NULL)"
_LIVE_DISTILLATION: Final = ("EXISTS (SELECT 1 FROM distillations ld JOIN memories lm ON lm.id = ld.memory_id "
                             "WHERE ld.id = {ref} AND ld.deleted_at IS NULL AND lm.deleted_at IS NULL)")
_USER: Final = "(%(user)s::text IS NULL OR t.user_id = %(user)s)"
# Which rows of each table a backup holds, and in what order.
_SELECTIONS: Final[dict[str, tuple[str, str]]] = {
    "memories": (f"t.deleted_at IS NULL AND {_USER}", "t.occurred_at, t.seq"),
    "distillations": (f"{_USER} AND {_LIVE_DISTILLATION.format(ref='t.id')}", "t.created_at, t.id"),
    "distillation_versions": (
        "t.deleted_at IS NULL AND " + _LIVE_DISTILLATION.format(ref="t.distillation_id")
        + " AND EXISTS (SELECT 1 FROM distillations x WHERE x.id = t.distillation_id"
          " AND (%(user)s::text IS NULL OR x.user_id = %(user)s))", "t.distillation_id, t.version"),
    "conflicts": (f"{_USER} AND {_LIVE_DISTILLATION.format(ref='t.distillation_a')} "
                  f"AND {_LIVE_DISTILLATION.format(ref='t.distillation_b')}", "t.created_at, t.id"),
    "turns": (f"t.deleted_at IS NULL AND {_USER} AND (t.memory_id IS NULL OR {_LIVE_MEMORY.format(ref='t.memory_id')})",
              "t.occurred_at, t.id"),
    "warmth_events": (f"{_USER} AND {_LIVE_DISTILLATION.format(ref='t.distillation_id')} AND (t.turn_id IS NULL OR "
                      "EXISTS (SELECT 1 FROM turns lt WHERE lt.id = t.turn_id AND lt.deleted_at IS NULL "
                      f"AND (lt.memory_id IS NULL OR {_LIVE_MEMORY.format(ref='lt.memory_id')})))", "t.id"),
    "api_keys": (_USER, "t.created_at, t.id"),
}
_FETCH_ROWS: Final = 500


def begin_snapshot(conn: psycopg.Connection) -> None:
    """Make the connection's transaction one read-only snapshot: every table read as of the same moment."""
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")


def backup_columns(conn: psycopg.Connection, table: str) -> list[str]:
    """The columns of ``table`` a backup holds: those the database does not compute, minus the left-out ones."""
    rows = conn.execute(
        """SELECT column_name FROM information_schema.columns
           WHERE table_schema = current_schema() AND table_name = %(table)s
             AND is_generated = 'NEVER' AND coalesce(identity_generation, '') <> 'ALWAYS'
           ORDER BY ordinal_position""",
        {"table": table},
    ).fetchall()
    left_out = _LEFT_OUT.get(table, frozenset())
    return [name for (name,) in rows if name not in left_out]


def backup_rows(conn: psycopg.Connection, table: str, columns: Sequence[str], *, user_id: str | None) -> Iterator[str]:
    """Each row of ``table`` the backup of ``user_id`` (None: everyone) holds, as JSON text, in order.

    Read through a server-side cursor, so a large history streams instead of filling memory.
    A distillation superseded by one that is not in the backup (forgotten) is written as current,
    as recall treats it.
    """
    where, order = _SELECTIONS[table]
    every = [name for (name,) in conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = %(table)s",
        {"table": table}).fetchall()]
    row: sql.Composable = sql.SQL("to_jsonb(t) - %(left_out)s::text[]")
    if table == "distillations" and "superseded_by" in columns:
        row = sql.SQL("{} || jsonb_build_object('superseded_by', CASE WHEN {} THEN t.superseded_by END)").format(
            row, sql.SQL(_LIVE_DISTILLATION.format(ref="t.superseded_by")))
    query = sql.SQL("SELECT ({})::text FROM {} t WHERE {} ORDER BY {}").format(
        row, sql.Identifier(table), sql.SQL(where), sql.SQL(order))
    with conn.cursor(name=f"yak_backup_{table}") as cursor:
        cursor.itersize = _FETCH_ROWS
        cursor.execute(query, {"user": user_id, "left_out": [c for c in every if c not in columns]})
        yield from (text for (text,) in cursor)


def backup_size_estimate(conn: psycopg.Connection, user_id: str | None) -> int:
    """About how many rows a backup of ``user_id`` holds, for a progress bar (forgotten rows counted too)."""
    return one_value(
        conn,
        """SELECT (SELECT count(*) FROM memories WHERE %(u)s::text IS NULL OR user_id = %(u)s)
                + (SELECT count(*) FROM distillations WHERE %(u)s::text IS NULL OR user_id = %(u)s)
                + (SELECT count(*) FROM turns WHERE %(u)s::text IS NULL OR user_id = %(u)s)
                + (SELECT count(*) FROM warmth_events WHERE %(u)s::text IS NULL OR user_id = %(u)s)""",
        {"u": user_id}, int)


def backup_users(conn: psycopg.Connection, user_id: str | None) -> list[str]:
    """The users whose live exchanges a backup of ``user_id`` (None: everyone) holds."""
    return [u for (u,) in conn.execute(
        "SELECT DISTINCT user_id FROM memories WHERE deleted_at IS NULL AND (%(u)s::text IS NULL OR user_id = %(u)s)"
        " ORDER BY 1", {"u": user_id}).fetchall()]


def existing_ids(conn: psycopg.Connection, table: str, ids: Sequence[str]) -> list[str]:
    """Which of ``ids`` ``table`` already holds (at most five, to name in a message)."""
    rows = conn.execute(sql.SQL("SELECT id::text FROM {} WHERE id = ANY(%(ids)s::uuid[]) ORDER BY id LIMIT 5").format(
        sql.Identifier(table)), {"ids": list(ids)}).fetchall()
    return [r[0] for r in rows]


def existing_exchanges(conn: psycopg.Connection, users: Sequence[str], digests: Sequence[str]) -> list[str]:
    """Users who already hold one of these exchanges (``(user, content_sha256)`` pairs), under any id."""
    rows = conn.execute(
        """SELECT DISTINCT m.user_id FROM memories m
           JOIN unnest(%(users)s::text[], %(digests)s::text[]) AS b(user_id, digest)
             ON m.user_id = b.user_id AND m.content_sha256 = b.digest
           ORDER BY 1 LIMIT 5""",
        {"users": list(users), "digests": list(digests)},
    ).fetchall()
    return [r[0] for r in rows]


def insertable_columns(conn: psycopg.Connection, table: str) -> set[str]:
    """The columns of ``table`` a restore may write."""
    return set(backup_columns(conn, table)) - _RENUMBERED.get(table, frozenset())


def start_restore(conn: psycopg.Connection) -> None:
    """A scratch table for the deferred columns, dropped with the restore's transaction."""
    conn.execute("CREATE TEMP TABLE yak_restore_deferred (tbl text NOT NULL, id uuid NOT NULL, cols jsonb NOT NULL)"
                 " ON COMMIT DROP")


def insert_backup_rows(conn: psycopg.Connection, table: str, columns: Sequence[str], rows: Sequence[str]) -> None:
    """Insert rows (JSON text of :func:`backup_rows`) with the given columns; defer :data:`DEFERRED_COLUMNS`."""
    deferred = [c for c in DEFERRED_COLUMNS.get(table, ()) if c in columns]
    written = [c for c in columns if c not in deferred]
    names = sql.SQL(", ").join(map(sql.Identifier, written))
    statement = sql.SQL("INSERT INTO {table} ({names}) SELECT {names} FROM jsonb_populate_record(NULL::{table}, %(row)s::jsonb)"
                        ).format(table=sql.Identifier(table), names=names)
    with conn.cursor() as cursor:
        cursor.executemany(statement, [{"row": row} for row in rows])
        if deferred:
            picked = sql.SQL(", ").join(sql.SQL("{name}, r -> {name}").format(name=sql.Literal(c)) for c in deferred)
            cursor.executemany(
                sql.SQL("INSERT INTO yak_restore_deferred (tbl, id, cols) SELECT {tbl}, (r ->> 'id')::uuid, "
                        "jsonb_build_object({picked}) FROM (SELECT %(row)s::jsonb AS r) x").format(
                    tbl=sql.Literal(table), picked=picked),
                [{"row": row} for row in rows])


def finish_restore(conn: psycopg.Connection) -> None:
    """Write the deferred columns, now that every row they point at or sit next to is in."""
    for table, columns in DEFERRED_COLUMNS.items():
        assignments = sql.SQL(", ").join(sql.SQL("{c} = r.{c}").format(c=sql.Identifier(c)) for c in columns)
        conn.execute(sql.SQL("UPDATE {table} t SET {assignments} FROM yak_restore_deferred d, "
                             "jsonb_populate_record(NULL::{table}, d.cols) r WHERE d.tbl = {name} AND t.id = d.id"
                             ).format(table=sql.Identifier(table), assignments=assignments, name=sql.Literal(table)))
