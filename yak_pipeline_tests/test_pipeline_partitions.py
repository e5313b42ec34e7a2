"""The Dagster view fits the data (issue 38): one partition per user with data, none that cannot
hold any, and a backfill of one user's date range (real database, real Dagster instance)."""

from __future__ import annotations

import json
import os
import shutil
import time
from datetime import date
from pathlib import Path

import dagster as dg
import pytest

from yak_pipeline.defs.automation.sensors import drop_folder_sensor
from yak_pipeline.defs.partitions import DAYS_TAG, users_partitions, window_tags
from yak_pipeline.defs.resources import PostgresResource
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline.store.memories import days_with_data
from yak_pipeline_tests.pipeline_helpers import (
    MEMORY_ASSETS,
    add_exchange,
    drop_dir,  # noqa: F401 - fixture
    fetch_all,
    materialization_metadata,
    new_instance,
    pipeline_env,  # noqa: F401 - fixture
    pipeline_resources,
    run_partition,
)

pytestmark = pytest.mark.usefixtures("pipeline_env")
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "drop"
# The memory job's assets (its quality check holds no asset of its own).
MEMORY_ASSET_KEYS = [key for asset in MEMORY_ASSETS for key in asset.keys]


def test_the_examples_leave_no_partition_that_cannot_hold_data(settings: Settings, database: Database,
                                                               drop_dir: Path) -> None:
    for example in EXAMPLES.iterdir():
        shutil.copy(example, drop_dir / example.name)
        os.utime(drop_dir / example.name, (time.time() - 60, time.time() - 60))  # finished writing
    # A second user arrives through the API on a day the examples have no exchange of.
    add_exchange(database, "zoe", "I collect stamps.", date(2026, 11, 30))
    # Ephemeral, as the other pipeline tests: a temporary persistent instance leaves Dagster's
    # process-wide definitions-load context pointing at it after it is gone.
    instance = new_instance()
    context = dg.build_sensor_context(
        instance=instance, resources={"postgres": PostgresResource.from_settings(settings)})
    tick = drop_folder_sensor(context)
    for request in tick.dynamic_partitions_requests:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    for request in tick.run_requests:  # what the daemon does: run each request with its tags
        assert dg.materialize(MEMORY_ASSETS, resources=pipeline_resources(settings), instance=instance,
                              partition_key=request.partition_key, tags=request.tags).success
    assert run_partition(instance, pipeline_resources(settings), "zoe", date(2026, 11, 30)).success

    keys = users_partitions.get_partition_keys(dynamic_partitions_store=instance)
    with database.connection() as conn:
        data = days_with_data(conn)
    # One partition per user with data; users × days would have listed every user on every day.
    assert keys == sorted({user for user, _ in data}) == ["demo", "zoe"]
    assert len({day for _, day in data}) > 1  # several days, still one partition each
    # Every partition holds data and every memory asset is materialized in each: nothing "missing".
    for asset_key in MEMORY_ASSET_KEYS:
        assert instance.get_materialized_partitions(asset_key) == set(keys), asset_key
    # The examples' runs named their days in the tag; none of them is a day without data.
    demo_days = {day.isoformat() for user, day in data if user == "demo"}
    demo_runs = instance.get_runs(filters=dg.RunsFilter(tags={"dagster/partition": "demo"}))
    assert demo_runs and all(set(json.loads(run.tags[DAYS_TAG])) <= demo_days for run in demo_runs)


def test_backfilling_one_users_date_range_redistils_those_days_only(
        settings: Settings, database: Database) -> None:
    days = [date(2026, 3, 10), date(2026, 3, 14), date(2026, 3, 15), date(2026, 3, 20)]
    for index, when in enumerate(days):
        add_exchange(database, "alice", f"I visited museum number {index}.", when)
    add_exchange(database, "bob", "I visited a museum too.", date(2026, 3, 14))
    instance = new_instance("alice", "bob")
    resources = pipeline_resources(settings)
    for user, when in [("alice", when) for when in days] + [("bob", date(2026, 3, 14))]:
        assert run_partition(instance, resources, user, when).success
    assert {row[0] for row in fetch_all(database, "SELECT prompt_version FROM distillations")} == {"v1"}

    # A prompt change, the case a backfill is for: the resources are built from settings naming it.
    resources = pipeline_resources(settings.model_copy(update={"prompt_version": "v2"}))
    # A backfill of alice's partition with the window as its tags (what the UI's backfill dialog sets).
    backfill = dg.materialize(MEMORY_ASSETS, resources=resources, instance=instance, partition_key="alice",
                              tags=window_tags(date(2026, 3, 14), date(2026, 3, 15)))

    assert backfill.success
    assert materialization_metadata(backfill, "distillations")["rows_out"] == 2
    assert materialization_metadata(backfill, "raw_exchanges")["day_span"] == "2026-03-14 … 2026-03-15"
    versions = fetch_all(database, """SELECT d.user_id, (m.occurred_at AT TIME ZONE 'UTC')::date, d.prompt_version
                                      FROM distillations d JOIN memories m ON m.id = d.memory_id ORDER BY 1, 2""")
    assert versions == [("alice", date(2026, 3, 10), "v1"), ("alice", date(2026, 3, 14), "v2"),
                        ("alice", date(2026, 3, 15), "v2"), ("alice", date(2026, 3, 20), "v1"),
                        ("bob", date(2026, 3, 14), "v1")]
    # A backfill of the whole user (no window) covers every day of theirs with data, and nobody else's.
    whole = dg.materialize(MEMORY_ASSETS, resources=resources, instance=instance, partition_key="alice")
    assert materialization_metadata(whole, "distillations")["rows_out"] == 2
    assert {row[0] for row in fetch_all(database, "SELECT prompt_version FROM distillations WHERE user_id = 'alice'")} \
        == {"v2"}
    assert fetch_all(database, "SELECT prompt_version FROM distillations WHERE user_id = 'bob'") == [("v1",)]


def test_a_run_with_an_unreadable_day_tag_fails_naming_the_tag(settings: Settings, database: Database) -> None:
    add_exchange(database, "alice", "I like tea.", date(2026, 3, 14))
    result = dg.materialize(MEMORY_ASSETS, resources=pipeline_resources(settings), instance=new_instance("alice"),
                            partition_key="alice", tags={"yak/since": "last week"}, raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert failure.step_failure_data.user_failure_data.description == (
        "run tag yak/since is 'last week', not a day (use YYYY-MM-DD)")
    assert fetch_all(database, "SELECT status FROM memories") == [("pending",)]
