"""Builds Yak's parts from settings: the one place entry points (CLI, API, Dagster resources) call.

Keeping this in one module means configuration is read in one place and every entry point
gets the same checks (embedder size against the database, migrations applied).
"""

from __future__ import annotations

import logging
import threading

import psycopg

from yak_pipeline.alerts import Alerter
from yak_pipeline.embeddings import Embedder, get_embedder
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database, connect, ensure_dagster_database, resolve_database_url
from yak_pipeline.store.errors import SchemaMismatch
from yak_pipeline.store.migrations import check_embedding_compatibility, migrate, migration_states, read_meta

logger = logging.getLogger(__name__)


def migrate_database(settings: Settings, url: str | None = None) -> list[str]:
    """Apply pending migrations to the configured database; return the names applied."""
    url = url or resolve_database_url(settings)
    embedder = get_embedder(settings)
    applied = migrate(url, dimensions=embedder.dimensions, model_name=embedder.model_name)
    try:
        ensure_dagster_database(url)
    except psycopg.Error as exc:
        # Yak's own tables do not need it; only `yak up` and the dagster CLI do.
        logger.warning("could not create the dagster database: %s", " ".join(str(exc).split())[:200])
    return [m.name for m in applied]


def open_database(settings: Settings, *, url: str | None = None, auto_migrate: bool = True, max_size: int = 10) -> Database:
    """A connection pool on the configured database, its schema current and matching the embedder.

    With ``auto_migrate`` pending migrations are applied first (a fresh embedded database just
    works); otherwise a database behind on migrations is an error naming the fix.
    """
    url = url or resolve_database_url(settings)
    embedder: Embedder = get_embedder(settings)
    if auto_migrate:
        migrate(url, dimensions=embedder.dimensions, model_name=embedder.model_name)
    else:
        with connect(url, vector=False) as conn:
            pending = [s.migration.name for s in migration_states(conn) if s.applied_at is None]
            if pending:
                raise SchemaMismatch(f"the database has pending migrations ({', '.join(pending)}): run `yak db migrate`")
            check_embedding_compatibility(read_meta(conn), dimensions=embedder.dimensions, model_name=embedder.model_name)
    return Database(url, max_size=max_size, secrets=settings.secrets).open()


_SHARED: dict[str, Database] = {}
_SHARED_LOCK = threading.Lock()


def shared_database(settings: Settings, *, max_size: int = 16) -> Database:
    """One migrated pool per database URL per process, for long-lived callers (runs, the API)."""
    url = resolve_database_url(settings)
    with _SHARED_LOCK:
        if url not in _SHARED:
            _SHARED[url] = open_database(settings, url=url, max_size=max_size)
        return _SHARED[url]


def build_alerter(settings: Settings, database: Database | None = None) -> Alerter:
    """The alerter for these settings; de-duplication spans processes through the database, and
    through ``$YAK_HOME/alert-state`` while the database cannot be reached."""
    secret = lambda value: value.get_secret_value() if value is not None else None  # noqa: E731
    return Alerter(
        error_webhook=secret(settings.error_webhook),
        critical_webhook=secret(settings.critical_webhook),
        dedup_seconds=settings.alert_dedup_seconds,
        connect=(lambda: connect(database.url, vector=False)) if database is not None else None,
        state_dir=settings.home / "alert-state",
    )
