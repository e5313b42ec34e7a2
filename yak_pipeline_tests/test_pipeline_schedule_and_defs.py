"""The nightly schedule's run requests, and the one ``Definitions`` object of the code location."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import dagster as dg

from yak_pipeline.definitions import defs
from yak_pipeline.defs.automation.schedules import NIGHTLY_DAYS, nightly_run_requests, nightly_warmth_schedule
from yak_pipeline.defs.distillations.checks import DISTILLATION_QUALITY_CHECK
from yak_pipeline.defs.partitions import (
    add_missing_partitions,
    days_partitions,
    exchange_partitions,
    partition_key,
    partition_parts,
    users_partitions,
)
from yak_pipeline.defs.resources import AlertsResource, EmbedderResource, LLMResource, PostgresResource

NIGHT = datetime(2026, 3, 15, 2, 0, tzinfo=timezone.utc)
NIGHTLY_CONFIG = {"ops": {"warmth": {"config": {"nightly": True, "days": NIGHTLY_DAYS}}}}
MEMORY_ASSETS = {"raw_exchanges", "distillations", "conflict_scores", "distillation_versions"}


# --- the nightly schedule ------------------------------------------------------------------------


def _evaluate(users: list[str], when: datetime, days: list[date] | None = None) -> list[dg.RunRequest] | dg.SkipReason:
    """One tick of the schedule on a (persistent, temporary) instance that knows ``users`` and
    ``days`` (default: the last 30 days before ``when``, all of them with data)."""
    # A schedule context needs a persistent instance: it is handed to the daemon by reference.
    if days is None:
        days = [when.date() - timedelta(days=back) for back in range(30)]
    with dg.instance_for_test() as instance:
        if users:
            instance.add_dynamic_partitions(users_partitions.name, users)
        instance.add_dynamic_partitions(days_partitions.name, [d.isoformat() for d in days])
        return nightly_warmth_schedule("UTC")(dg.build_schedule_context(instance=instance, scheduled_execution_time=when))


def test_schedule_requests_seven_days_for_every_user_with_the_nightly_config() -> None:
    requests = _evaluate(["bob", "alice"], NIGHT)

    days = [date(2026, 3, 15) - timedelta(days=back) for back in range(7)]
    assert [str(r.partition_key) for r in requests] == [str(partition_key(user, day))
                                                        for user in ("alice", "bob") for day in days]
    assert all(r.run_config == NIGHTLY_CONFIG and r.tags["yak/trigger"] == "nightly" for r in requests)
    assert len({r.run_key for r in requests}) == 14
    # The next night asks again under new run keys (a run key is used once, ever).
    tomorrow = _evaluate(["alice"], NIGHT + timedelta(days=1))
    assert not {r.run_key for r in tomorrow} & {r.run_key for r in requests}
    assert str(tomorrow[0].partition_key) == str(partition_key("alice", date(2026, 3, 16)))


def test_schedule_skips_when_there_are_no_users_yet() -> None:
    assert isinstance(_evaluate([], NIGHT), dg.SkipReason)


def test_schedule_requests_only_days_that_are_partitions() -> None:
    # Days are added as data arrives: a day nobody talked has no partition and nothing to re-evaluate.
    requests = _evaluate(["alice"], NIGHT, days=[date(2026, 3, 15), date(2026, 3, 12), date(2026, 1, 2)])
    assert [str(r.partition_key) for r in requests] == [str(partition_key("alice", date(2026, 3, 15))),
                                                        str(partition_key("alice", date(2026, 3, 12)))]
    assert isinstance(_evaluate(["alice"], NIGHT, days=[date(2026, 1, 2)]), dg.SkipReason)


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


def test_nightly_requests_use_utc_partition_days_in_zones_ahead_of_utc() -> None:
    # 02:00 in Tokyo is 17:00 UTC the day before: that day's partition is the newest one that exists.
    tokyo_night = datetime(2026, 3, 15, 2, 0, tzinfo=ZoneInfo("Asia/Tokyo"))
    requests = nightly_run_requests(["alice"], tokyo_night)
    days = [partition_parts(str(r.partition_key))[1] for r in requests]
    assert days == [date(2026, 3, 14) - timedelta(days=back) for back in range(7)]
    # Los Angeles is behind UTC: 02:00 there is 10:00 UTC the same day.
    la_night = datetime(2026, 3, 15, 2, 0, tzinfo=ZoneInfo("America/Los_Angeles"))
    assert partition_parts(str(nightly_run_requests(["alice"], la_night)[0].partition_key))[1] == date(2026, 3, 15)


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


def test_every_asset_is_partitioned_by_user_and_day_and_described() -> None:
    graph = defs.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        spec = graph.get(key)
        assert spec.partitions_def == exchange_partitions, key
        assert spec.description and len(spec.description) > 40, key
    lineage = {k.to_user_string(): {p.to_user_string() for p in graph.get(k).parent_keys}
               for k in graph.get_all_asset_keys()}
    assert lineage == {"raw_exchanges": set(), "distillations": {"raw_exchanges"},
                       "conflict_scores": {"distillations"}, "distillation_versions": {"conflict_scores"},
                       "warmth": set()}
    # warmth has no parent on purpose; its description says why, so the UI does not look broken.
    assert "stands alone in the lineage graph" in graph.get(dg.AssetKey("warmth")).description


def test_partitions_grow_with_the_data_instead_of_starting_in_2000() -> None:
    # A fresh UI listed every day since 2000 ("9,819 of 9,824 missing"); now only days with data exist.
    dimensions = {d.name: d.partitions_def for d in exchange_partitions.partitions_defs}
    assert dimensions == {"date": days_partitions, "user": users_partitions}
    instance = dg.DagsterInstance.ephemeral()
    assert exchange_partitions.get_partition_keys(dynamic_partitions_store=instance) == []
    add_missing_partitions(instance, [("demo", date(2026, 11, 18)), ("demo", date(2026, 11, 19))])
    add_missing_partitions(instance, [("demo", date(2026, 11, 19))])  # known: nothing added twice
    keys = exchange_partitions.get_partition_keys(dynamic_partitions_store=instance)
    assert sorted(map(str, keys)) == ["2026-11-18|demo", "2026-11-19|demo"]


def test_jobs_select_the_right_assets_and_the_blocking_gate() -> None:
    check_key = dg.AssetCheckKey(dg.AssetKey("distillations"), DISTILLATION_QUALITY_CHECK)
    memory_job = defs.resolve_job_def("memory_job")
    assert {k.to_user_string() for k in memory_job.asset_layer.selected_asset_keys} == MEMORY_ASSETS
    assert memory_job.asset_layer.asset_graph.asset_check_keys == {check_key}
    assert memory_job.partitions_def == exchange_partitions
    warmth_job = defs.resolve_job_def("warmth_job")
    assert {k.to_user_string() for k in warmth_job.asset_layer.selected_asset_keys} == {"warmth"}
    assert warmth_job.asset_layer.asset_graph.asset_check_keys == set()
    check = defs.resolve_asset_graph().get_check_spec(check_key)
    assert check.blocking and check.partitions_def == exchange_partitions


def test_partition_keys_order_date_before_user_and_round_trip() -> None:
    key = partition_key("alice.b@example", date(2026, 1, 2))
    assert str(key) == "2026-01-02|alice.b@example"
    assert partition_parts(key) == partition_parts(str(key)) == ("alice.b@example", date(2026, 1, 2))


# --- `yak up`'s code server -------------------------------------------------------------------------


def test_yak_up_points_daemon_and_webserver_at_one_code_server_with_warm_run_workers(tmp_path) -> None:
    import yaml

    from yak_pipeline.cli.pipeline import CODE_LOCATION, _run_worker_preload, _write_workspace
    from yak_pipeline.settings import Settings

    workspace = yaml.safe_load(_write_workspace(tmp_path, "127.0.0.1", 4321).read_text())
    assert workspace == {"load_from": [{"grpc_server": {"host": "127.0.0.1", "port": 4321,
                                                        "location_name": CODE_LOCATION}}]}
    # Run workers fork from a process that imported the project (and torch only when the local embedder is used).
    local = _run_worker_preload(Settings(embedder="local"))
    assert local[0] == CODE_LOCATION and {"dagster_postgres", "torch", "sentence_transformers"} <= set(local)
    assert "torch" not in _run_worker_preload(Settings(embedder="hashing"))
