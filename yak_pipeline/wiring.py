"""Builds Yak's parts from settings: the one place entry points (CLI, API, Dagster resources) call.

Keeping this in one module means configuration is read in one place and every entry point
gets the same checks (embedder size against the database, migrations applied).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg

from yak_pipeline.alerts import Alerter
from yak_pipeline.embeddings import Embedder, get_embedder
from yak_pipeline.settings import Settings, get_settings
from yak_pipeline.store.database import Database, connect, ensure_dagster_database, resolve_database_url
from yak_pipeline.store.errors import SchemaMismatch
from yak_pipeline.store.migrations import check_embedding_compatibility, migrate, migration_states, read_meta

if TYPE_CHECKING:  # imported where used: a command that needs no LLM or recall does not import them
    from yak_pipeline.core.recall import RecallParams
    from yak_pipeline.core.relevance import RelevanceModel
    from yak_pipeline.llm.provider import LLMProvider
    from yak_pipeline.services.recall_judge import LLMRecallJudge

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


@dataclass(frozen=True, eq=False)
class YakParts:
    """Yak's parts for one configuration: the settings, and the database, embedder, LLM, alerter,
    recall defaults, relevance model and judge built from them.

    Built lazily and kept: a part costs nothing until first used (the local embedder loads a
    model, the database opens a pool), so ``yak --help`` or a command that only talks to a server
    never pays for them. Parts given to :func:`build_parts` (tests, the in-process CLI) are used
    as they are.
    """

    settings: Settings
    _built: dict[str, Any] = field(default_factory=dict, repr=False)
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def _part(self, name: str, build: Callable[[], Any]) -> Any:  # noqa: ANN401 - each accessor names its type
        with self._lock:
            if name not in self._built:
                self._built[name] = build()
            return self._built[name]

    @property
    def database(self) -> Database:
        """The process-wide migrated pool for these settings (:func:`shared_database`); raises
        ``DatabaseUnavailable`` while the server is down."""
        return self._part("database", lambda: shared_database(self.settings))

    @property
    def database_if_open(self) -> Database | None:
        """The pool if it was opened (or given) already; never tries to connect."""
        return self._built.get("database")

    @property
    def embedder(self) -> Embedder:
        """The configured embedder (the local model loads on first use, once per process)."""
        return self._part("embedder", lambda: get_embedder(self.settings))

    @property
    def llm(self) -> LLMProvider:
        """The configured LLM provider (the offline rules stand-in without an endpoint)."""
        from yak_pipeline.llm import get_llm_provider

        return self._part("llm", lambda: get_llm_provider(self.settings))

    @property
    def alerter(self) -> Alerter:
        """The alerter; built again once the database is open, so its de-duplication then spans processes."""
        with self._lock:
            current = self._built.get("alerter")
            if current is None or (not self._built.get("alerter_final") and self.database_if_open is not None):
                current = self._built["alerter"] = build_alerter(self.settings, self.database_if_open)
                self._built["alerter_final"] = self.database_if_open is not None
            return current

    def recall_params(self, *, threshold: float = 0.7, limit: int = 5) -> RecallParams:
        """Recall parameters: a request's threshold and limit, the configured scoring and search."""
        from yak_pipeline.services.recall import recall_params

        return recall_params(self.settings, threshold=threshold, limit=limit)

    @property
    def relevance_model(self) -> RelevanceModel:
        """The relevance model fitted for the configured embedder."""
        from yak_pipeline.services.recall import relevance_model

        return relevance_model(self.settings, self.embedder)

    @property
    def judge(self) -> LLMRecallJudge | None:
        """The LLM's second opinion on recalled memories, when ``YAK_RECALL_LLM_JUDGE`` is on with an endpoint."""
        from yak_pipeline.services.recall_judge import recall_judge

        return recall_judge(self.settings, lambda: self.llm)


def build_parts(settings: Settings, *, database: Database | None = None, embedder: Embedder | None = None,
                llm: LLMProvider | None = None, alerter: Alerter | None = None) -> YakParts:
    """The parts for ``settings``, built when first used; those given are used as they are."""
    given = {"database": database, "embedder": embedder, "llm": llm, "alerter": alerter}
    built: dict[str, Any] = {name: part for name, part in given.items() if part is not None}
    if alerter is not None:
        built["alerter_final"] = True
    return YakParts(settings, built)


def process_parts() -> YakParts:
    """The parts for this process's ``YAK_*`` environment: what an entry point without its own
    settings uses (``uvicorn yak_pipeline.api.app:create_app --factory``)."""
    return build_parts(get_settings())


def parts_of(given: YakParts | Settings) -> YakParts:
    """``given`` if it is parts already, else the parts built from those settings."""
    return given if isinstance(given, YakParts) else build_parts(given)
