"""Dagster resources: small typed wrappers that hand assets the same parts the API and CLI use.

Unset fields fall back to the ``YAK_*`` settings; secrets reach them only through ``EnvVar``
(see :func:`default_resources`), so they never appear in the run config shown in the UI.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dagster as dg

from yak_pipeline.alerts import Alerter
from yak_pipeline.embeddings import Embedder, get_embedder
from yak_pipeline.llm import get_llm_provider
from yak_pipeline.llm.provider import LLMProvider
from yak_pipeline.settings import Settings, get_settings
from yak_pipeline.store.database import Database
from yak_pipeline.store.errors import DatabaseUnavailable
from yak_pipeline.wiring import build_alerter, shared_database


def _settings(**overrides: Any) -> Settings:
    """The process settings with the resource's explicitly set fields on top."""
    given = {k: v for k, v in overrides.items() if v is not None}
    if not given:
        return get_settings()
    # Validated, not model_copy(update=...): that skips validation, so a secret given as a plain
    # string (an EnvVar's value) stayed a str and `.get_secret_value()` crashed every run.
    return Settings.model_validate({**get_settings().model_dump(), **given})


class PostgresResource(dg.ConfigurableResource):
    """Yak's PostgreSQL: ``database_url``, or the embedded server under ``$YAK_HOME``."""

    database_url: str | None = None

    def settings(self) -> Settings:
        """Settings pointing at this resource's database."""
        return _settings(database_url=self.database_url)

    def database(self) -> Database:
        """The process-wide connection pool (schema migrated and checked against the embedder)."""
        return shared_database(self.settings())


class LLMResource(dg.ConfigurableResource):
    """The LLM used for distillation, consolidation, conflict and relevance judgements."""

    base_url: str | None = None
    model: str | None = None
    api_key: str | None = None
    timeout_seconds: float | None = None
    max_retries: int | None = None
    concurrency: int | None = None

    def settings(self) -> Settings:
        """Settings with this resource's fields applied."""
        return _settings(llm_base_url=self.base_url, llm_model=self.model, llm_api_key=self.api_key,
                         llm_timeout_seconds=self.timeout_seconds, llm_max_retries=self.max_retries,
                         llm_concurrency=self.concurrency)

    def provider(self) -> LLMProvider:
        """An OpenAI-compatible provider, or the offline rules provider when no endpoint is set."""
        return get_llm_provider(self.settings())

    def max_concurrency(self) -> int:
        """How many LLM calls a run may have in flight."""
        return self.settings().llm_concurrency


class EmbedderResource(dg.ConfigurableResource):
    """The embedding model (its name and size are stored with every vector)."""

    kind: str | None = None
    model: str | None = None
    base_url: str | None = None
    dimensions: int | None = None

    def embedder(self) -> Embedder:
        """The configured embedder, loaded once per process."""
        return get_embedder(_settings(embedder=self.kind, embed_model=self.model, embed_base_url=self.base_url,
                                      embed_dimensions=self.dimensions))


class AlertsResource(dg.ConfigurableResource):
    """Webhook alerts, de-duplicated across processes through the database."""

    postgres: PostgresResource
    error_webhook: str | None = None
    critical_webhook: str | None = None
    dedup_seconds: int | None = None

    def alerter(self) -> Alerter:
        """An alerter for runs and sensors."""
        settings = _settings(error_webhook=self.error_webhook, critical_webhook=self.critical_webhook,
                             alert_dedup_seconds=self.dedup_seconds)
        try:
            database = self.postgres.database()
        except DatabaseUnavailable:
            database = None  # de-duplicated through $YAK_HOME/alert-state until it is back
        return build_alerter(settings, database)

    @contextmanager
    def database_guard(self, what: str) -> Iterator[None]:
        """Run the body; if the database goes away, send the (de-duplicated, critical)
        ``db_connection_lost`` alert and let the error fail the step."""
        try:
            yield
        except DatabaseUnavailable as exc:
            self.alerter().alert("db_connection_lost", f"{what} lost the database", level="critical", error=str(exc))
            raise


def _secret(name: str) -> dg.EnvVar | None:
    """``EnvVar(name)`` when the variable is set: the value stays out of run config and the UI."""
    return dg.EnvVar(name) if os.environ.get(name) else None


def default_resources() -> dict[str, dg.ConfigurableResource]:
    """The resources of the code location, configured from the environment."""
    postgres = PostgresResource(database_url=_secret("YAK_DATABASE_URL"))
    return {
        "postgres": postgres,
        "llm": LLMResource(api_key=_secret("YAK_LLM_API_KEY")),
        "embedder": EmbedderResource(),
        "alerts": AlertsResource(postgres=postgres, error_webhook=_secret("YAK_ERROR_WEBHOOK"),
                                 critical_webhook=_secret("YAK_CRITICAL_WEBHOOK")),
    }
