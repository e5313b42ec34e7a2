"""Applies ``yak_pipeline/sql/NNN_*.sql`` in order, each in its own transaction, recorded in ``schema_migrations``.

The migrations are package data, read with :mod:`importlib.resources`: a wheel install finds them
as well as a source checkout or an editable install.

The embedding dimension is a property of the database: it is substituted into the first
migration from the configured embedder and recorded in ``yak_meta``; later starts with an
embedder of another size fail with a one-line error instead of storing garbage similarity.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from importlib.resources import files
from importlib.resources.abc import Traversable

import psycopg

from yak_pipeline.store.database import connect
from yak_pipeline.store.errors import PgvectorMissing, SchemaMismatch
from yak_pipeline.store.memory_types import type_distillations
from yak_pipeline.store.profile import rebuild_profile_lines
from yak_pipeline.store.rows import one_value

SQL_DIR: Traversable = files("yak_pipeline") / "sql"
_MIGRATION_NAME = re.compile(r"^(\d{3})_[a-z0-9_]+\.sql$")
# Serialises concurrent `yak db migrate` runs against one database.
_MIGRATION_LOCK_KEY = 0x59414B  # "YAK"

# Migrations whose new table (or column) is filled from the existing rows by the code that keeps it afterwards.
_FILLED_AFTER: dict[int, Callable[[psycopg.Connection], object]] = {16: rebuild_profile_lines,
                                                                   17: type_distillations}

# The tables of DESIGN §3, which `yak db status` counts.
DATA_TABLES = (
    "memories",
    "distillations",
    "distillation_versions",
    "conflicts",
    "turns",
    "warmth_events",
    "audit_log",
)


@dataclass(frozen=True)
class Migration:
    """One migration file."""

    version: int
    name: str
    path: Traversable

    def sql(self, embedding_dim: int) -> str:
        """The migration's SQL with the embedding dimension filled in."""
        return self.path.read_text().replace("{{EMBEDDING_DIM}}", str(int(embedding_dim)))


@dataclass(frozen=True)
class MigrationState:
    """A migration and when it was applied (None: pending)."""

    migration: Migration
    applied_at: datetime | None


def discover_migrations(sql_dir: Traversable = SQL_DIR) -> list[Migration]:
    """The migration files in version order; a misnamed or duplicated file is an error."""
    migrations: list[Migration] = []
    # A Traversable (package data, perhaps inside a zip) has no glob: filter its entries by name.
    for path in sorted((p for p in sql_dir.iterdir() if p.name.endswith(".sql")), key=lambda p: p.name):
        match = _MIGRATION_NAME.match(path.name)
        if not match:
            raise SchemaMismatch(f"migration file {path.name} is not named NNN_name.sql")
        migrations.append(Migration(int(match.group(1)), path.name.removesuffix(".sql"), path))
    versions = [m.version for m in migrations]
    if len(set(versions)) != len(versions):
        raise SchemaMismatch(f"two migration files share a number in {sql_dir}")
    return migrations


def _ensure_bookkeeping(conn: psycopg.Connection) -> None:
    conn.execute(
        """CREATE TABLE IF NOT EXISTS schema_migrations (
               version    integer PRIMARY KEY,
               name       text NOT NULL,
               applied_at timestamptz NOT NULL DEFAULT now())"""
    )


# Recall reads the HNSW indexes with pgvector's iterative scan (``hnsw.iterative_scan``), new in 0.8.
PGVECTOR_MIN_VERSION = (0, 8)


def _ensure_pgvector(conn: psycopg.Connection) -> None:
    available = conn.execute(
        "SELECT default_version FROM pg_available_extensions WHERE name = 'vector'"
    ).fetchone()
    wanted = ".".join(map(str, PGVECTOR_MIN_VERSION))
    if available is None:
        raise PgvectorMissing(
            f"this PostgreSQL server has no pgvector extension: install pgvector {wanted}+ on it, "
            "or unset YAK_DATABASE_URL to use the embedded server"
        )
    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    installed = one_value(conn, "SELECT extversion FROM pg_extension WHERE extname = 'vector'", None, str)
    if tuple(int(part) for part in installed.split(".")[:2]) < PGVECTOR_MIN_VERSION:
        raise PgvectorMissing(
            f"this database has pgvector {installed}; Yak needs {wanted}+ (iterative index scans): "
            f"install it on the server and run `ALTER EXTENSION vector UPDATE`, or unset YAK_DATABASE_URL "
            "to use the embedded server"
        )


def read_meta(conn: psycopg.Connection) -> dict[str, str]:
    """The ``yak_meta`` facts (empty before the first migration)."""
    exists = one_value(conn, "SELECT to_regclass('yak_meta') IS NOT NULL", None, bool)
    if not exists:
        return {}
    return dict(conn.execute("SELECT key, value FROM yak_meta").fetchall())


def check_embedding_compatibility(meta: dict[str, str], *, dimensions: int, model_name: str) -> None:
    """Raise :class:`SchemaMismatch` when the configured embedder cannot share this database."""
    stored = meta.get("embedding_dim")
    if stored is not None and int(stored) != dimensions:
        raise SchemaMismatch(
            f"YAK_EMBEDDER gives {dimensions}-dimensional vectors ({model_name}) but this database "
            f"holds {stored}-dimensional ones ({meta.get('embedding_model', '?')}): carry it over with "
            "`yak distill re-embed --all`, switch YAK_EMBEDDER back, or point YAK_DATABASE_URL/YAK_HOME "
            "at a new database"
        )


def migration_states(conn: psycopg.Connection, sql_dir: Traversable = SQL_DIR) -> list[MigrationState]:
    """Every migration with its applied time, or None when pending."""
    exists = one_value(conn, "SELECT to_regclass('schema_migrations') IS NOT NULL", None, bool)
    applied: dict[int, datetime] = {}
    if exists:
        applied = dict(conn.execute("SELECT version, applied_at FROM schema_migrations").fetchall())
    return [MigrationState(m, applied.get(m.version)) for m in discover_migrations(sql_dir)]


def migrate(url: str, *, dimensions: int, model_name: str, sql_dir: Traversable = SQL_DIR) -> list[Migration]:
    """Apply the pending migrations to the database at ``url``; return those applied.

    Idempotent: a second run applies nothing. Each migration commits on its own, so a failing
    one leaves the earlier ones applied and itself not at all.
    """
    with connect(url, autocommit=True, vector=False) as conn:
        conn.execute("SELECT pg_advisory_lock(%(key)s)", {"key": _MIGRATION_LOCK_KEY})
        try:
            _ensure_pgvector(conn)
            _ensure_bookkeeping(conn)
            check_embedding_compatibility(read_meta(conn), dimensions=dimensions, model_name=model_name)
            applied: list[Migration] = []
            for state in migration_states(conn, sql_dir):
                if state.applied_at is not None:
                    continue
                migration = state.migration
                with conn.transaction():
                    conn.execute(migration.sql(dimensions))
                    conn.execute(
                        "INSERT INTO schema_migrations (version, name) VALUES (%(version)s, %(name)s)",
                        {"version": migration.version, "name": migration.name},
                    )
                    # A migration whose rows are read from the data by Python code, not SQL.
                    if migration.version in _FILLED_AFTER:
                        _FILLED_AFTER[migration.version](conn)
                    if migration.version == 1:
                        conn.execute(
                            "INSERT INTO yak_meta (key, value) VALUES ('embedding_dim', %(dimensions)s), ('embedding_model', %(model_name)s)",
                            {"dimensions": str(dimensions), "model_name": model_name},
                        )
                applied.append(migration)
            return applied
        finally:
            conn.execute("SELECT pg_advisory_unlock(%(key)s)", {"key": _MIGRATION_LOCK_KEY})


def table_counts(conn: psycopg.Connection) -> dict[str, int | None]:
    """Row counts of the DESIGN §3 tables (None for a table that does not exist yet)."""
    counts: dict[str, int | None] = {}
    for table in DATA_TABLES:
        if one_value(conn, "SELECT to_regclass(%(table)s) IS NOT NULL", {"table": table}, bool):
            counts[table] = one_value(conn, f"SELECT count(*) FROM {table}", None, int)  # noqa: S608 - fixed names
        else:
            counts[table] = None
    return counts


def server_versions(conn: psycopg.Connection) -> dict[str, str | None]:
    """The server's PostgreSQL version and its pgvector version (None when not installed)."""
    postgresql = one_value(conn, "SHOW server_version", None, str).split(" ")[0]
    row = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
    return {"postgresql": postgresql, "pgvector": row[0] if row else None}
