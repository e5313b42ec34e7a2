"""The nightly schedule's run requests, and the one ``Definitions`` object of the code location."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import dagster as dg
import pytest

from yak_pipeline.definitions import defs
from yak_pipeline.defs.automation.schedules import NIGHTLY_DAYS, nightly_run_requests, nightly_warmth_schedule
from yak_pipeline.defs.distillations.checks import DISTILLATION_QUALITY_CHECK
from yak_pipeline.defs.partitions import (
    DAYS_TAG,
    SINCE_TAG,
    UNTIL_TAG,
    RunDaysError,
    add_missing_partitions,
    tagged_days,
    users_partitions,
)
from yak_pipeline.defs.resources import AlertsResource, EmbedderResource, LLMResource, PostgresResource

NIGHT = datetime(2026, 3, 15, 2, 0, tzinfo=UTC)
NIGHTLY_CONFIG = {"ops": {"warmth": {"config": {"nightly": True, "days": NIGHTLY_DAYS}}}}
MEMORY_ASSETS = {"raw_exchanges", "distillations", "conflict_scores", "distillation_versions"}


# --- the nightly schedule ------------------------------------------------------------------------


def _evaluate(users: list[str], when: datetime) -> list[dg.RunRequest] | dg.SkipReason:
    """One tick of the schedule on a (persistent, temporary) instance that knows ``users``."""
    # A schedule context needs a persistent instance: it is handed to the daemon by reference.
    with dg.instance_for_test() as instance:
        if users:
            instance.add_dynamic_partitions(users_partitions.name, users)
        return nightly_warmth_schedule("UTC")(dg.build_schedule_context(instance=instance, scheduled_execution_time=when))


def test_schedule_requests_one_run_per_user_over_the_last_seven_days() -> None:
    requests = _evaluate(["bob", "alice"], NIGHT)

    # One run per user (the partition), its days the window's: not a run per user and day.
    assert [r.partition_key for r in requests] == ["alice", "bob"]
    assert all(r.run_config == NIGHTLY_CONFIG and r.tags["yak/trigger"] == "nightly" for r in requests)
    assert all((r.tags[SINCE_TAG], r.tags[UNTIL_TAG]) == ("2026-03-09", "2026-03-15") for r in requests)
    assert len({r.run_key for r in requests}) == 2
    # The next night asks again under new run keys (a run key is used once, ever).
    tomorrow = _evaluate(["alice"], NIGHT + timedelta(days=1))
    assert not {r.run_key for r in tomorrow} & {r.run_key for r in requests}
    assert tomorrow[0].tags[UNTIL_TAG] == "2026-03-16"


def test_schedule_skips_when_there_are_no_users_yet() -> None:
    assert isinstance(_evaluate([], NIGHT), dg.SkipReason)


def test_schedule_definition_runs_warmth_at_two_in_the_configured_zone() -> None:
    schedule = defs.resolve_schedule_def("nightly_warmth_schedule")
    assert schedule.cron_schedule == "0 2 * * *"
    assert schedule.execution_timezone == "UTC"  # YAK_TIMEZONE's default
    assert schedule.job_name == "warmth_job"
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING


def test_recall_indexes_are_maintained_at_three_in_the_configured_zone() -> None:
    schedule = defs.resolve_schedule_def("nightly_recall_index_schedule")
    assert schedule.cron_schedule == "0 3 * * *" and schedule.execution_timezone == "UTC"
    assert schedule.job_name == "recall_index_job"
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING


def test_nightly_requests_use_utc_days_in_zones_ahead_of_utc() -> None:
    # 02:00 in Tokyo is 17:00 UTC the day before: that is the newest day that can hold data.
    tokyo_night = datetime(2026, 3, 15, 2, 0, tzinfo=ZoneInfo("Asia/Tokyo"))
    [request] = nightly_run_requests(["alice"], tokyo_night)
    assert (request.tags[SINCE_TAG], request.tags[UNTIL_TAG]) == ("2026-03-08", "2026-03-14")
    # Los Angeles is behind UTC: 02:00 there is 10:00 UTC the same day.
    la_night = datetime(2026, 3, 15, 2, 0, tzinfo=ZoneInfo("America/Los_Angeles"))
    assert nightly_run_requests(["alice"], la_night)[0].tags[UNTIL_TAG] == "2026-03-15"


# --- definitions -----------------------------------------------------------------------------------


def test_definitions_load_and_validate() -> None:
    dg.Definitions.validate_loadable(defs)
    jobs = {job.name for job in defs.resolve_all_job_defs()}
    assert {"memory_job", "warmth_job", "recall_index_job"} <= jobs
    graph = defs.resolve_asset_graph()
    assert {k.to_user_string() for k in graph.get_all_asset_keys()} == MEMORY_ASSETS | {"warmth"}
    assert {s.name for s in defs.sensors} == {"drop_folder_sensor", "api_inbox_sensor", "turns_sensor",
                                              "run_failure_alert_sensor"}
    resources = defs.resources
    assert isinstance(resources["postgres"], PostgresResource) and isinstance(resources["llm"], LLMResource)
    assert isinstance(resources["embedder"], EmbedderResource) and isinstance(resources["alerts"], AlertsResource)


def test_every_asset_is_partitioned_by_user_and_described() -> None:
    graph = defs.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        spec = graph.get(key)
        assert spec.partitions_def == users_partitions, key
        assert spec.description and len(spec.description) > 40, key
    lineage = {k.to_user_string(): {p.to_user_string() for p in graph.get(k).parent_keys}
               for k in graph.get_all_asset_keys()}
    assert lineage == {"raw_exchanges": set(), "distillations": {"raw_exchanges"},
                       "conflict_scores": {"distillations"}, "distillation_versions": {"conflict_scores"},
                       "warmth": set()}
    # warmth has no parent on purpose; its description says why, so the UI does not look broken.
    assert "stands alone in the lineage graph" in graph.get(dg.AssetKey("warmth")).description


def test_partitions_are_the_users_with_data_not_a_user_by_day_cross_product() -> None:
    # Users × days listed every combination: 15 partitions for the examples, 9 that could never hold data.
    assert isinstance(users_partitions, dg.DynamicPartitionsDefinition) and users_partitions.name == "users"
    instance = dg.DagsterInstance.ephemeral()
    assert users_partitions.get_partition_keys(dynamic_partitions_store=instance) == []
    add_missing_partitions(instance, [("demo", date(2026, 11, 18)), ("demo", date(2026, 11, 19)),
                                      ("zoe", date(2026, 11, 19))])
    add_missing_partitions(instance, [("demo", date(2026, 11, 20))])  # known: nothing added twice
    assert users_partitions.get_partition_keys(dynamic_partitions_store=instance) == ["demo", "zoe"]


def test_jobs_select_the_right_assets_and_the_blocking_gate() -> None:
    check_key = dg.AssetCheckKey(dg.AssetKey("distillations"), DISTILLATION_QUALITY_CHECK)
    memory_job = defs.resolve_job_def("memory_job")
    assert {k.to_user_string() for k in memory_job.asset_layer.selected_asset_keys} == MEMORY_ASSETS
    assert memory_job.asset_layer.asset_graph.asset_check_keys == {check_key}
    assert memory_job.partitions_def == users_partitions
    warmth_job = defs.resolve_job_def("warmth_job")
    assert {k.to_user_string() for k in warmth_job.asset_layer.selected_asset_keys} == {"warmth"}
    assert warmth_job.asset_layer.asset_graph.asset_check_keys == set()
    check = defs.resolve_asset_graph().get_check_spec(check_key)
    assert check.blocking and check.partitions_def == users_partitions


def test_a_runs_day_tags_are_read_and_a_bad_one_is_named() -> None:
    assert tagged_days({DAYS_TAG: '["2026-01-03", "2026-01-02"]'}) == ([date(2026, 1, 3), date(2026, 1, 2)], None, None)
    assert tagged_days({SINCE_TAG: "2026-01-01", UNTIL_TAG: "2026-01-31"}) == (None, date(2026, 1, 1),
                                                                               date(2026, 1, 31))
    assert tagged_days({}) == (None, None, None)
    for bad in ({DAYS_TAG: "2026-01-02"}, {DAYS_TAG: '["Jan 2"]'}, {SINCE_TAG: "yesterday"}):
        with pytest.raises(RunDaysError, match="yak/"):
            tagged_days(bad)


# --- `yak up`'s code server -------------------------------------------------------------------------


def test_yak_up_points_daemon_and_webserver_at_one_code_server_with_warm_run_workers(tmp_path) -> None:
    import yaml

    from yak_pipeline.cli.dagster_runtime import CODE_LOCATION, run_worker_preload, write_workspace
    from yak_pipeline.settings import Settings

    workspace = yaml.safe_load(write_workspace(tmp_path, "127.0.0.1", 4321).read_text())
    assert workspace == {"load_from": [{"grpc_server": {"host": "127.0.0.1", "port": 4321,
                                                        "location_name": CODE_LOCATION}}]}
    # Run workers fork from a process that imported the project (and the document model's runtime
    # only when the local embedder is used; torch is not it).
    local = run_worker_preload(Settings(embedder="local"))
    assert local[0] == CODE_LOCATION and {"dagster_postgres", "onnxruntime", "tokenizers"} <= set(local)
    assert "torch" not in local and "onnxruntime" not in run_worker_preload(Settings(embedder="hashing"))
