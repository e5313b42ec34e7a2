"""Shared parts of the Dagster pipeline tests: real resources, seeded rows, one-partition runs.

Everything here drives the real pipeline: the resources point at the test's own migrated
PostgreSQL database, the LLM is either the offline rules provider or the loopback
OpenAI-protocol server, and runs go through ``dg.materialize`` on an ephemeral instance.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from datetime import UTC, date, datetime, time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from yak_pipeline.defs.distillations.assets import distillations
from yak_pipeline.defs.distillations.checks import distillation_quality
from yak_pipeline.defs.exchanges.assets import raw_exchanges
from yak_pipeline.defs.partitions import add_missing_partitions, day_tags, users_partitions
from yak_pipeline.defs.resources import AlertsResource, EmbedderResource, LLMResource, PostgresResource
from yak_pipeline.defs.scores.assets import conflict_scores, distillation_versions
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline.store.memories import insert_memory, new_exchange

# Partitioned asset checks are a preview feature of Dagster 1.13 (the definitions module says so too).
warnings.filterwarnings("ignore", category=dg.PreviewWarning)

MEMORY_ASSETS = [raw_exchanges, distillations, distillation_quality, conflict_scores, distillation_versions]
"""What ``memory_job`` runs: the raw layer, distillations with their blocking check, conflicts, merges."""

DAY = date(2026, 3, 14)
NEXT_DAY = date(2026, 3, 15)


def llm_resource(settings: Settings, base_url: str | None, *, timeout_seconds: float = 2.0, max_retries: int = 0,
                 concurrency: int = 1) -> LLMResource:
    """The LLM resource for ``settings``: the loopback server at ``base_url``, or the rules provider when None.

    No retries and a short timeout by default, so failure tests take milliseconds, not minutes.
    """
    return LLMResource.from_settings(settings, base_url=base_url, model="fake-model",
                                     api_key="test-key" if base_url else None, timeout_seconds=timeout_seconds,
                                     max_retries=max_retries, concurrency=concurrency)


def pipeline_resources(settings: Settings, *, llm_base_url: str | None = None, error_webhook: str | None = None,
                       **llm_options: Any) -> dict[str, dg.ConfigurableResource]:
    """Every resource the assets need, built from the test's settings (its database, home and
    drop folder, the hashing embedder), with the LLM at ``llm_base_url``."""
    postgres = PostgresResource.from_settings(settings)
    return {
        "postgres": postgres,
        "llm": llm_resource(settings, llm_base_url, **llm_options),
        "embedder": EmbedderResource.from_settings(settings),
        "alerts": AlertsResource.from_settings(settings, postgres, error_webhook=error_webhook),
    }


def new_instance(*users: str) -> dg.DagsterInstance:
    """An ephemeral Dagster instance that already knows ``users`` as partitions."""
    instance = dg.DagsterInstance.ephemeral()
    if users:
        instance.add_dynamic_partitions(users_partitions.name, list(users))
    return instance


def run_partition(
    instance: dg.DagsterInstance,
    resources: dict[str, dg.ConfigurableResource],
    user_id: str,
    day: date,
    assets: Sequence[Any] = tuple(MEMORY_ASSETS),
    run_config: dict | None = None,
    tags: dict[str, str] | None = None,
) -> dg.ExecuteInProcessResult:
    """Materialize ``assets`` for one user's day (the user's partition, the day in its ``yak/days``
    tag), never raising on a failed step (adding the user as a partition first, as the sensors do);
    ``tags`` are the run's (a sensor's request, whose days replace ``day``)."""
    add_missing_partitions(instance, [(user_id, day)])
    return dg.materialize(list(assets), resources=resources, partition_key=user_id, instance=instance,
                          raise_on_error=False, run_config=run_config, tags={**day_tags([day]), **(tags or {})})


def materialization_metadata(result: dg.ExecuteInProcessResult, asset: str) -> dict[str, Any] | None:
    """The plain metadata values of ``asset``'s materialization in this run (None: not materialized)."""
    for event in result.get_asset_materialization_events():
        materialization = event.event_specific_data.materialization
        if materialization.asset_key.to_user_string() == asset:
            return {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}
    return None


def materialized_assets(result: dg.ExecuteInProcessResult) -> set[str]:
    """Names of the assets materialized by this run."""
    return {e.event_specific_data.materialization.asset_key.to_user_string()
            for e in result.get_asset_materialization_events()}


def at(day: date, hour: int = 12, minute: int = 0) -> datetime:
    """A UTC time on ``day``."""
    return datetime.combine(day, time(hour, minute), tzinfo=UTC)


def add_exchange(db: Database, user_id: str, user_text: str, day: date, *, assistant: str = "Noted.",
                 minute: int = 0, source: str = "api") -> str:
    """Store one exchange as a pending memory (as the API does); return its id."""
    with db.connection() as conn:
        stored = insert_memory(conn, new_exchange(user_id=user_id, content=f"User: {user_text}\nAssistant: {assistant}",
                                                  source=source, occurred_at=at(day, 12, minute)))
    return str(stored.id)


def fetch_all(db: Database, sql: str, params: Sequence[Any] | dict | None = None) -> list[tuple]:
    """All rows of one query."""
    with db.connection() as conn:
        return conn.execute(sql, params).fetchall()


def fetch_one(db: Database, sql: str, params: Sequence[Any] | dict | None = None) -> tuple | None:
    """The first row of one query."""
    with db.connection() as conn:
        return conn.execute(sql, params).fetchone()


@pytest.fixture
def drop_dir(settings: Settings) -> Path:
    """The drop folder of the test's settings, which resources built from them read."""
    folder = settings.resolved_drop_dir
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def pipeline_env(settings: Settings) -> Iterator[Settings]:
    """The test's settings; the process-wide pool the resources open on its database is closed
    before the database is dropped."""
    yield settings
    from yak_pipeline.wiring import _SHARED, _SHARED_LOCK

    with _SHARED_LOCK:
        pool = _SHARED.pop(settings.database_url or "", None)
    if pool is not None:
        pool.close()
