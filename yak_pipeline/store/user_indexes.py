"""Per-user HNSW indexes: a heavy user's vectors in graphs of their own.

The shared HNSW index of a vector column holds every user's rows. Read for one user with
pgvector 0.8's iterative scan it is exact in order, but it walks past the other users' rows to
find this user's: at 100,000 distillations of ten users (realistic text, where people say much
the same things) one cosine leg visited about 2,400 buffers and cost 12–13 ms p50, against about
6 ms on a partial index holding only that user's rows (docs/BENCHMARKS.md §2e). So a user with more rows
in a column than an exact scan reads quickly (``store.vector_legs.EXACT_SCAN_MAX_ROWS``) gets a
partial index ``WHERE user_id = '<user>'`` on it, built by :func:`ensure_user_indexes` (the
nightly ``recall_index_job``, ``yak db index``, the end of ``yak process``); PostgreSQL keeps it
up to date on every write, like any index. Until it exists, and for everyone else, the shared
index serves, so recall is the same either way, only slower.

The planner uses a partial index only when it can prove the index's predicate from the query,
so recall names the user as a literal in the legs that read one (``store.vector_legs.vector_search``).

Many users with indexes of their own make every planning of a query on the table consider all
of them: this fits a personal memory system (a person, a household, a small team), and
docs/SCALING.md says what to do beyond (partitioning or sharding by ``user_id``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Final, Literal

import psycopg
from psycopg import sql

VectorColumn = tuple[Literal["distillations", "memories"], Literal["embedding", "context_embedding"]]

# Every vector column a recall leg searches (store/vector_legs.py).
VECTOR_COLUMNS: Final[tuple[VectorColumn, ...]] = (
    ("distillations", "embedding"),
    ("memories", "embedding"),
    ("memories", "context_embedding"),
)

# A user gets their own index on a column from this many live vectors on: below it recall scans
# their rows exactly (store.vector_legs.EXACT_SCAN_MAX_ROWS is this figure). Their index is dropped
# only when they fall under half of it, so a user near the line does not flap.
USER_INDEX_MIN_ROWS: Final[int] = 2_000


def user_index_name(table: str, column: str, user_id: str) -> str:
    """The name of ``user_id``'s own HNSW index on ``table.column`` (a hash: user ids are not identifiers).

    Distinct from pgvector 0.6's per-user indexes (``<table>_hnsw_user_<hash>``, dropped by sql/010).
    """
    digest = hashlib.sha256(user_id.encode()).hexdigest()[:16]
    return f"{table}_{column}_u_{digest}"


def describe_build(table: str, column: str, user_id: str, rows: int) -> str:
    """The progress line for one build (what :func:`ensure_user_indexes` tells ``on_build``)."""
    return f"building {user_id}'s own recall index on {table}.{column} ({rows} rows)"


def user_indexes(conn: psycopg.Connection, user_id: str) -> frozenset[VectorColumn]:
    """The vector columns on which ``user_id`` has a valid (fully built) index of their own.

    An interrupted ``CREATE INDEX CONCURRENTLY`` leaves an invalid index that the planner ignores;
    so does this.
    """
    names = {user_index_name(table, column, user_id): (table, column) for table, column in VECTOR_COLUMNS}
    rows = conn.execute(
        """SELECT c.relname FROM pg_class c JOIN pg_index i ON i.indexrelid = c.oid
           WHERE c.relname = ANY(%(names)s) AND c.relnamespace = current_schema()::regnamespace
             AND i.indisvalid AND i.indisready""",
        {"names": list(names)},
    ).fetchall()
    return frozenset(names[r[0]] for r in rows)


def ensure_user_indexes(
    conn: psycopg.Connection,
    *,
    min_rows: int = USER_INDEX_MIN_ROWS,
    concurrently: bool = True,
    on_build: Callable[[str, str, str, int], None] | None = None,
) -> list[str]:
    """Give every user with ``min_rows`` live vectors in a column their own HNSW index on it.

    Idempotent, and cheap when nothing is to do (one grouped count per column); returns the names
    of the indexes built. ``concurrently`` (the default) builds without blocking writes or recall
    and needs an autocommit connection. An invalid leftover of an interrupted build is rebuilt;
    the index of a user who fell under half of ``min_rows`` (forgotten rows) is dropped.
    ``on_build(table, column, user_id, rows)`` is told before each build (they take seconds;
    :func:`describe_build` words it).
    """
    if concurrently and not conn.autocommit:
        raise ValueError("ensure_user_indexes(concurrently=True) needs an autocommit connection")
    how = sql.SQL("CONCURRENTLY ") if concurrently else sql.SQL("")
    built: list[str] = []
    for table, column in VECTOR_COLUMNS:
        counts: dict[str, int] = dict(conn.execute(
            sql.SQL("SELECT user_id, count(*) FROM {} WHERE {} IS NOT NULL AND deleted_at IS NULL GROUP BY user_id")
            .format(sql.Identifier(table), sql.Identifier(column))).fetchall())
        prefix = f"{table}_{column}_u_"
        existing: dict[str, bool] = dict(conn.execute(
            """SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
               WHERE i.indrelid = %(table)s::regclass AND left(c.relname, %(prefix_length)s) = %(prefix)s""",
            {"table": table, "prefix_length": len(prefix), "prefix": prefix}).fetchall())
        wanted = {user_index_name(table, column, user): (user, n) for user, n in counts.items() if n >= min_rows}
        keep = {user_index_name(table, column, user) for user, n in counts.items() if n >= min_rows // 2}
        for name, valid in existing.items():
            if name not in keep or not valid:
                conn.execute(sql.SQL("DROP INDEX {}IF EXISTS {}").format(how, sql.Identifier(name)))
        for name, (user, rows) in sorted(wanted.items()):
            if existing.get(name):
                continue
            if on_build is not None:
                on_build(table, column, user, rows)
            conn.execute(sql.SQL("CREATE INDEX {}IF NOT EXISTS {} ON {} USING hnsw ({} vector_cosine_ops) "
                                 "WHERE user_id = {}").format(how, sql.Identifier(name), sql.Identifier(table),
                                                              sql.Identifier(column), sql.Literal(user)))
            built.append(name)
    return built

