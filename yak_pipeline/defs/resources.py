"""Dagster resources: small typed wrappers that hand assets the same parts the API and CLI use.

Each resource is complete when defined: :func:`default_resources` builds every one from one
:class:`~yak_pipeline.settings.Settings` (``definitions.py`` passes the code location's), each
field set, the secrets as ``EnvVar`` so their values never appear in the run config the UI shows.
A resource reads no environment of its own at run time: what it builds (the pool, the embedder,
the LLM, the alerter) follows from its fields alone, and the Postgres resource checks the
database's schema against its own ``embedder``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import dagster as dg
from pydantic import SecretStr

from yak_pipeline.alerts import Alerter
from yak_pipeline.embeddings import Embedder, get_embedder
from yak_pipeline.llm import get_llm_provider
from yak_pipeline.llm.provider import LLMProvider
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline.store.errors import DatabaseUnavailable
from yak_pipeline.wiring import build_alerter, shared_database


class _GivenSettings(Settings):
    """Settings from the values given alone, defaults for the rest: no ``YAK_*`` variable is read."""

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,  # noqa: ANN001, ANN206
                                   file_secret_settings):
        return (init_settings,)


def _secret(name: str, value: SecretStr | str | None) -> dg.EnvVar | str | None:
    """``EnvVar(name)`` when the variable holds the secret: its value stays out of run config and the UI.

    A secret the settings were given otherwise (a test's explicit Settings) is passed as it is.
    """
    if os.environ.get(name):
        return dg.EnvVar(name)
    return value.get_secret_value() if isinstance(value, SecretStr) else value


class _SettingsFields(dg.ConfigurableResource):
    """A resource whose fields are settings: ``SETTINGS`` names each field's Settings field,
    ``SECRETS`` the ``YAK_*`` variable each secret field is read from at run time."""

    SETTINGS: ClassVar[dict[str, str]] = {}
    SECRETS: ClassVar[dict[str, str]] = {}

    def setting_values(self) -> dict[str, Any]:
        """This resource's fields, by the name of their setting."""
        return {setting: getattr(self, name) for name, setting in self.SETTINGS.items()}

    @classmethod
    def fields_from(cls, settings: Settings) -> dict[str, Any]:
        """The fields of this resource for ``settings`` (secrets as ``EnvVar``, paths as text)."""
        fields: dict[str, Any] = {}
        for name, setting in cls.SETTINGS.items():
            value = getattr(settings, setting)
            if name in cls.SECRETS:
                value = _secret(cls.SECRETS[name], value)
            elif value is not None and not isinstance(value, bool | int | float | str):
                value = str(value)  # a Path
            fields[name] = value
        return fields


class _EmbedderFields(_SettingsFields):
    """The embedder's settings, named as in :class:`~yak_pipeline.settings.Settings` (but one): the embedder
    resource's, and the Postgres resource's (the schema is checked against its vectors)."""

    # `embedder_kind`, not `embedder`: EmbedderResource.embedder() is the embedder itself.
    SETTINGS: ClassVar[dict[str, str]] = {"embedder_kind": "embedder", **{name: name for name in (
        "embed_model", "embed_base_url", "embed_dimensions", "llm_api_key", "llm_timeout_seconds",
        "llm_max_retries")}}
    SECRETS: ClassVar[dict[str, str]] = {"llm_api_key": "YAK_LLM_API_KEY"}

    embedder_kind: str
    embed_model: str | None
    embed_base_url: str | None
    embed_dimensions: int | None
    llm_api_key: str | None
    llm_timeout_seconds: float
    llm_max_retries: int

    @classmethod
    def fields_from(cls, settings: Settings) -> dict[str, Any]:
        """The fields for ``settings``; the openai embedder's endpoint (by default the LLM's) resolved."""
        return {**super().fields_from(settings), "embed_base_url": settings.embed_base_url or settings.llm_base_url}

    def settings(self) -> Settings:
        """Settings holding this resource's fields."""
        return _GivenSettings(**self.setting_values())


class EmbedderResource(_EmbedderFields):
    """The embedding model (its name and size are stored with every vector)."""

    @classmethod
    def from_settings(cls, settings: Settings, **fields: Any) -> EmbedderResource:  # noqa: ANN401
        """The resource for ``settings`` (``fields`` on top)."""
        return cls(**{**cls.fields_from(settings), **fields})

    def embedder(self) -> Embedder:
        """The configured embedder, loaded once per process."""
        return get_embedder(self.settings())


class PostgresResource(_EmbedderFields):
    """Yak's PostgreSQL: ``database_url``, or the embedded server under ``home``; its schema is checked
    against the embedder these fields name. Also where drop files are read from (``drop_dir``)."""

    SETTINGS: ClassVar[dict[str, str]] = {"database_url": "database_url", "home": "home", "secrets": "secrets",
                                          "drop_dir": "drop_dir", **_EmbedderFields.SETTINGS}
    SECRETS: ClassVar[dict[str, str]] = {"database_url": "YAK_DATABASE_URL", **_EmbedderFields.SECRETS}

    database_url: str | None
    home: str
    secrets: str
    drop_dir: str

    @classmethod
    def fields_from(cls, settings: Settings) -> dict[str, Any]:
        """The fields for ``settings``, the drop folder resolved."""
        return {**super().fields_from(settings), "drop_dir": str(settings.resolved_drop_dir)}

    @classmethod
    def from_settings(cls, settings: Settings, **fields: Any) -> PostgresResource:  # noqa: ANN401
        """The resource for ``settings`` (``fields`` on top)."""
        return cls(**{**cls.fields_from(settings), **fields})

    def database(self) -> Database:
        """The process-wide connection pool (schema migrated and checked against this resource's embedder)."""
        return shared_database(self.settings())


# The settings recall is scored with: the warmth asset's offline judge (``services.warmth.offline_judge``)
# ranks with them, as recall does.
_RECALL = ("half_life_days", "decay_enabled", "core_threshold_multiplier", "recall_relevance_exponent",
           "recall_superseded_factor", "recall_leg_size", "recall_exchange_context", "recall_present_newest_first",
           "recall_raw_exchanges", "recall_query_parts")


class LLMResource(_SettingsFields):
    """The LLM used for distillation, consolidation, conflict and relevance judgements; with the
    prompt version distillations record and the recall settings the offline relevance judge scores with."""

    SETTINGS: ClassVar[dict[str, str]] = {
        "base_url": "llm_base_url", "model": "llm_model", "api_key": "llm_api_key",
        "timeout_seconds": "llm_timeout_seconds", "max_retries": "llm_max_retries", "concurrency": "llm_concurrency",
        "structured_output": "llm_structured_output", "max_tokens": "llm_max_tokens",
        "prompt_version": "prompt_version", "home": "home", **{name: name for name in _RECALL}}
    SECRETS: ClassVar[dict[str, str]] = {"api_key": "YAK_LLM_API_KEY"}

    base_url: str | None
    model: str
    api_key: str | None
    timeout_seconds: float
    max_retries: int
    concurrency: int
    structured_output: str
    max_tokens: int
    prompt_version: str
    home: str
    half_life_days: float
    decay_enabled: bool
    core_threshold_multiplier: float
    recall_relevance_exponent: float
    recall_superseded_factor: float
    recall_leg_size: int
    recall_exchange_context: bool
    recall_present_newest_first: bool
    recall_raw_exchanges: bool
    recall_query_parts: bool

    @classmethod
    def from_settings(cls, settings: Settings, **fields: Any) -> LLMResource:  # noqa: ANN401
        """The resource for ``settings`` (``fields`` on top)."""
        return cls(**{**cls.fields_from(settings), **fields})

    def settings(self) -> Settings:
        """Settings with this resource's fields."""
        return _GivenSettings(**self.setting_values())

    def provider(self) -> LLMProvider:
        """An OpenAI-compatible provider, or the offline rules provider when no endpoint is set."""
        return get_llm_provider(self.settings())

    def max_concurrency(self) -> int:
        """How many LLM calls a run may have in flight."""
        return self.concurrency


class AlertsResource(_SettingsFields):
    """Webhook alerts, de-duplicated across processes through the database (and ``$YAK_HOME/alert-state``
    of the Postgres resource's home while it cannot be reached)."""

    SETTINGS: ClassVar[dict[str, str]] = {"error_webhook": "error_webhook", "critical_webhook": "critical_webhook",
                                          "dedup_seconds": "alert_dedup_seconds"}
    SECRETS: ClassVar[dict[str, str]] = {"error_webhook": "YAK_ERROR_WEBHOOK",
                                         "critical_webhook": "YAK_CRITICAL_WEBHOOK"}

    postgres: PostgresResource
    error_webhook: str | None
    critical_webhook: str | None
    dedup_seconds: int

    @classmethod
    def from_settings(cls, settings: Settings, postgres: PostgresResource | None = None,
                      **fields: Any) -> AlertsResource:  # noqa: ANN401
        """The resource for ``settings`` (``fields`` on top), on ``postgres`` (default: built from them)."""
        return cls(**{**cls.fields_from(settings), "postgres": postgres or PostgresResource.from_settings(settings),
                      **fields})

    def alerter(self) -> Alerter:
        """An alerter for runs and sensors."""
        settings = _GivenSettings(**self.setting_values(), home=self.postgres.home)
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


def default_resources(settings: Settings) -> dict[str, dg.ConfigurableResource]:
    """The resources of the code location, every field from ``settings`` (secrets as ``EnvVar``)."""
    postgres = PostgresResource.from_settings(settings)
    return {
        "postgres": postgres,
        "llm": LLMResource.from_settings(settings),
        "embedder": EmbedderResource.from_settings(settings),
        "alerts": AlertsResource.from_settings(settings, postgres),
    }
