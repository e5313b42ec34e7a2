"""The sensors, evaluated with ``dg.build_sensor_context`` against a real database and drop folder.

Each tick is checked for what it asks of Dagster — run requests with their partition keys (users),
days, run keys and tags, new and forgotten user partitions, the new cursor — and for what it did on disk and in the
database; the drop folder's requested runs are then run, as the daemon would, and checked too.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import pytest

from yak_loopback.openai_server import FakeOpenAIServer
from yak_pipeline.defs.automation.sensors import (
    api_inbox_sensor,
    drop_folder_sensor,
    run_failure_alert_sensor,
    turns_sensor,
)
from yak_pipeline.defs.exchanges.assets import DROP_FILES_TAG, raw_exchanges
from yak_pipeline.defs.partitions import DAYS_TAG, add_missing_partitions, day_tags, users_partitions
from yak_pipeline.defs.resources import AlertsResource, PostgresResource
from yak_pipeline.ingestion.claim import claim_drop_files
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline.store.forget import forget_memories
from yak_pipeline.store.memories import record_memory_error
from yak_pipeline.store.turns import insert_turn
from yak_pipeline_tests.pipeline_helpers import (
    DAY,
    NEXT_DAY,
    add_exchange,
    drop_dir,  # noqa: F401 - fixture
    fetch_all,
    materialization_metadata,
    new_instance,
    pipeline_env,  # noqa: F401 - fixture
    pipeline_resources,
    run_partition,
)
from yak_pipeline_tests.store_helpers import seed_memory_with_distillation

pytestmark = pytest.mark.usefixtures("pipeline_env")


def _tick(sensor: dg.SensorDefinition, instance: dg.DagsterInstance, settings: Settings,
          cursor: str | None = None, **resources: object) -> dg.SensorResult:
    """One evaluation of ``sensor``, as the daemon would run it."""
    context = dg.build_sensor_context(instance=instance, cursor=cursor,
                                      resources={"postgres": PostgresResource.from_settings(settings),
                                                 **resources})
    result = sensor(context)
    assert isinstance(result, dg.SensorResult)
    return result


def _keys(result: dg.SensorResult) -> list[str]:
    return [str(r.partition_key) for r in result.run_requests]


def _days(request: dg.RunRequest) -> list[str]:
    """The days a requested run covers (its ``yak/days`` tag)."""
    return json.loads(request.tags[DAYS_TAG])


def _added_users(result: dg.SensorResult) -> list[str]:
    # Only the users definition exists: no request may name another (the old "days" dimension).
    assert {request.partitions_def_name for request in result.dynamic_partitions_requests} <= {users_partitions.name}
    return [key for request in result.dynamic_partitions_requests
            if isinstance(request, dg.AddDynamicPartitionsRequest) for key in request.partition_keys]


def _deleted_users(result: dg.SensorResult) -> list[str]:
    return [key for request in result.dynamic_partitions_requests
            if isinstance(request, dg.DeleteDynamicPartitionsRequest) for key in request.partition_keys]


def _apply_partition_requests(instance: dg.DagsterInstance, result: dg.SensorResult) -> None:
    """What the daemon does with a tick's dynamic partition requests."""
    for request in result.dynamic_partitions_requests:
        assert request.partitions_def_name == users_partitions.name
        if isinstance(request, dg.DeleteDynamicPartitionsRequest):
            for key in request.partition_keys:
                instance.delete_dynamic_partition(request.partitions_def_name, key)
        else:
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))


def _line(user_id: str, text: str, day: str) -> str:
    return json.dumps({"user_id": user_id, "user": text, "assistant": "Noted.", "occurred_at": f"{day}T10:00:00Z"})


def _drop(folder: Path, name: str, text: str, *, age_seconds: float = 60) -> Path:
    """A file in the drop folder, finished writing ``age_seconds`` ago."""
    path = folder / name
    path.write_text(text)
    past = time.time() - age_seconds
    os.utime(path, (past, past))
    return path


# --- drop folder ---------------------------------------------------------------------------------


def _run_requested(instance: dg.DagsterInstance, settings: Settings, result: dg.SensorResult) -> None:
    """What the daemon does with a tick: add its partitions, then run each requested memory run (offline LLM)."""
    _apply_partition_requests(instance, result)
    for request in result.run_requests:
        first_day = datetime.fromisoformat(_days(request)[0]).date()  # the request's tags name all its days
        run = run_partition(instance, pipeline_resources(settings), request.partition_key, first_day,
                            tags=request.tags)
        assert run.success


def test_drop_folder_tick_detects_files_and_requests_runs_that_store_them(
        settings: Settings, database: Database, drop_dir: Path) -> None:
    _drop(drop_dir, "history.jsonl", "\n".join([_line("alice", "I live in Berlin.", "2026-03-14"),
                                                _line("alice", "I like tea.", "2026-03-14"),
                                                _line("bob", "I work as a nurse.", "2026-03-15")]) + "\n")
    _drop(drop_dir, "broken.json", '{"user_id": "alice", "user": "unterminated')
    _drop(drop_dir, "mixed.jsonl", _line("carol", "I have a cat.", "2026-03-14") + "\n"
          + _line("eve|x", "I own a boat.", "2026-03-14") + "\n")
    _drop(drop_dir, "notes.md", "---\nuser_id: dave\ndate: 2026-03-15\n---\n\nUser: I play chess.\nAssistant: Nice.\n")
    # Modified "in the future": still too young however long this busy machine takes to reach the tick.
    _drop(drop_dir, "still-writing.jsonl", _line("alice", "I like jazz.", "2026-03-14"), age_seconds=-60)
    instance = new_instance("alice")  # alice is known already; bob, carol and dave are new

    result = _tick(drop_folder_sensor, instance, settings)

    # One run per user (the partition), naming the days it covers.
    assert _keys(result) == ["alice", "bob", "carol", "dave"]
    assert [_days(r) for r in result.run_requests] == [[str(DAY)], [str(NEXT_DAY)], [str(DAY)], [str(NEXT_DAY)]]
    assert all(r.run_key.startswith(f"drop:{r.partition_key}:") for r in result.run_requests)
    assert len({r.run_key for r in result.run_requests}) == 4
    # Each run is told which files hold its user's exchanges: its raw_exchanges stores them.
    assert [json.loads(r.tags[DROP_FILES_TAG]) for r in result.run_requests] == [
        ["history.jsonl"], ["history.jsonl"], ["mixed.jsonl"], ["notes.md"]]
    assert _added_users(result) == ["bob", "carol", "dave"]
    assert _deleted_users(result) == []
    assert set(json.loads(result.cursor)) == {f"{DAY}|alice", f"{DAY}|carol", f"{NEXT_DAY}|bob", f"{NEXT_DAY}|dave"}

    # The tick stores nothing: the files wait for their runs. Only the unreadable one, which no run
    # will claim, is quarantined at once with its reason; the young one is left alone.
    assert fetch_all(database, "SELECT count(*) FROM memories") == [(0,)]
    assert sorted(p.name for p in drop_dir.iterdir() if p.is_file()) == [
        "history.jsonl", "mixed.jsonl", "notes.md", "still-writing.jsonl"]
    assert (drop_dir / "failed" / "broken.json").exists()
    error = (drop_dir / "failed" / "broken.json.error.txt").read_text()
    assert error.startswith("broken.json: line 1") and "JSON" in error

    _run_requested(instance, settings, result)

    # The runs stored the files, then moved them; bad records quarantined with their reasons.
    assert sorted(p.name for p in (drop_dir / "processed").iterdir()) == ["history.jsonl", "mixed.jsonl", "notes.md"]
    assert json.loads((drop_dir / "failed" / "mixed.rejected.jsonl").read_text())["user_id"] == "eve|x"
    rejected_reason = (drop_dir / "failed" / "mixed.rejected.jsonl.error.txt").read_text()
    assert rejected_reason.startswith("line 2: user_id: invalid user id 'eve|x'")  # '|' would break partition keys
    assert not list((drop_dir / "failed").glob("history*"))  # stored by one run, not quarantined twice
    assert (drop_dir / "still-writing.jsonl").exists()

    stored = fetch_all(database, "SELECT user_id, source, source_ref, status FROM memories ORDER BY user_id, content")
    assert [(u, src) for u, src, _, _ in stored] == [("alice", "drop_folder")] * 2 + [
        ("bob", "drop_folder"), ("carol", "drop_folder"), ("dave", "drop_folder")]
    assert {ref for _, _, ref, _ in stored} == {"history.jsonl", "mixed.jsonl", "notes.md"}
    assert {status for *_, status in stored} == {"distilled"}
    assert not any("|" in u for u, *_ in stored)

    # The next tick, with the cursor, requests nothing twice and adds no user twice.
    quiet = _tick(drop_folder_sensor, instance, settings, cursor=result.cursor)
    assert quiet.run_requests == [] and quiet.dynamic_partitions_requests == []
    assert quiet.skip_reason is not None


def test_the_raw_exchanges_of_a_partition_store_the_files_its_run_names(
        settings: Settings, database: Database, drop_dir: Path) -> None:
    """The asset, not the sensor, stores: in the UI, the rows come from the run that materialized them."""
    _drop(drop_dir, "a.jsonl", _line("alice", "I live in Berlin.", "2026-03-14") + "\n")
    _drop(drop_dir, "b.jsonl", _line("bob", "I like tea.", "2026-03-15") + "\n")
    instance = new_instance("alice")
    run = run_partition(instance, {"postgres": PostgresResource.from_settings(settings)}, "alice", DAY,
                        assets=[raw_exchanges], tags={DROP_FILES_TAG: json.dumps(["a.jsonl"])})
    assert run.success
    meta = materialization_metadata(run, "raw_exchanges")
    assert meta["rows_in"] == 1 and meta["drop_files_claimed"] == 1
    assert [(f["name"], f["stored"]) for f in meta["drop_files"]] == [("a.jsonl", 1)]
    assert fetch_all(database, "SELECT user_id FROM memories") == [("alice",)]
    assert (drop_dir / "processed" / "a.jsonl").exists() and (drop_dir / "b.jsonl").exists()


def test_runs_claiming_the_same_file_at_once_store_it_once_and_quarantine_its_bad_records_once(
        settings: Settings, database: Database, drop_dir: Path) -> None:
    """A file holding several partitions is named in each of their runs, which may start side by side."""
    lines = [_line(user, f"I keep note {i}.", "2026-03-14") for i, user in enumerate(["alice", "bob", "carol"])]
    _drop(drop_dir, "shared.jsonl", "\n".join([*lines, _line("eve|x", "I own a boat.", "2026-03-14")]) + "\n")
    barrier = threading.Barrier(3)

    def claim() -> list:
        barrier.wait()
        return claim_drop_files(database, drop_dir, names=["shared.jsonl"]).files

    with ThreadPoolExecutor(3) as pool:
        outcomes = [outcome for files in pool.map(lambda _: claim(), range(3)) for outcome in files]

    assert [(o.name, o.stored, o.rejected, o.error) for o in outcomes] == [("shared.jsonl", 3, 1, None)]
    assert fetch_all(database, "SELECT count(*) FROM memories") == [(3,)]
    assert sorted(p.name for p in (drop_dir / "failed").iterdir()) == [
        "shared.rejected.jsonl", "shared.rejected.jsonl.error.txt"]
    assert [p.name for p in (drop_dir / "processed").iterdir()] == ["shared.jsonl"]


def test_a_new_drop_file_for_a_known_partition_requests_it_again_under_a_new_run_key(
        settings: Settings, database: Database, drop_dir: Path) -> None:
    _drop(drop_dir, "a.jsonl", _line("alice", "I live in Berlin.", "2026-03-14") + "\n")
    instance = new_instance()
    first = _tick(drop_folder_sensor, instance, settings)
    assert _added_users(first) == ["alice"]
    _run_requested(instance, settings, first)

    _drop(drop_dir, "b.jsonl", _line("alice", "I like tea.", "2026-03-14") + "\n")
    # The same exchange dropped again is stored once and changes nothing.
    _drop(drop_dir, "a-again.jsonl", _line("alice", "I live in Berlin.", "2026-03-14") + "\n")
    second = _tick(drop_folder_sensor, instance, settings, cursor=first.cursor)

    assert _keys(second) == ["alice"]
    assert second.run_requests[0].run_key != first.run_requests[0].run_key
    assert second.dynamic_partitions_requests == []
    _run_requested(instance, settings, second)
    assert fetch_all(database, "SELECT count(*) FROM memories") == [(2,)]
    assert sorted(p.name for p in (drop_dir / "processed").iterdir()) == ["a-again.jsonl", "a.jsonl", "b.jsonl"]


def test_a_partition_whose_drop_run_is_still_going_is_left_to_it_then_asked_again_for_what_it_left(
        settings: Settings, database: Database, drop_dir: Path) -> None:
    """Storing a file changes its partitions' pending state while their runs go on: no new run then."""
    _drop(drop_dir, "a.jsonl", _line("alice", "I live in Berlin.", "2026-03-14") + "\n")
    instance = new_instance("alice")
    first = _tick(drop_folder_sensor, instance, settings)
    [request] = first.run_requests
    # The daemon launched the requested run; its raw_exchanges stored the file, its distilling goes on.
    run = dg.DagsterRun(job_name="memory_job", run_id=str(uuid.uuid4()), status=dg.DagsterRunStatus.STARTED,
                        tags={**request.tags, "dagster/partition": str(request.partition_key)})
    instance.add_run(run)
    claim_drop_files(database, drop_dir, names=json.loads(request.tags[DROP_FILES_TAG]))

    during = _tick(drop_folder_sensor, instance, settings, cursor=first.cursor)
    assert during.run_requests == []
    assert json.loads(during.cursor) == json.loads(first.cursor)  # the state last requested is kept

    # The run failed before distilling: its memories are still pending, so they get a new run.
    instance.report_run_failed(run)
    after = _tick(drop_folder_sensor, instance, settings, cursor=during.cursor)
    assert _keys(after) == ["alice"]
    assert after.run_requests[0].run_key != request.run_key
    assert DROP_FILES_TAG not in after.run_requests[0].tags  # the file is stored: nothing left to claim


# --- API inbox -------------------------------------------------------------------------------------


def test_inbox_sensor_requests_pending_api_memories_once_per_state(settings: Settings, database: Database) -> None:
    first_memory = add_exchange(database, "alice", "I live in Berlin.", DAY)
    add_exchange(database, "bob", "I like tea.", NEXT_DAY)
    add_exchange(database, "carol", "I have a cat.", DAY, source="drop_folder")  # the drop sensor's, not ours
    instance = new_instance("alice")

    first = _tick(api_inbox_sensor, instance, settings)

    assert _keys(first) == ["alice", "bob"]
    assert all(r.run_key.startswith("inbox:") for r in first.run_requests)
    assert _added_users(first) == ["bob"]
    _apply_partition_requests(instance, first)

    same = _tick(api_inbox_sensor, instance, settings, cursor=first.cursor)
    assert same.run_requests == []

    # A failed attempt changes the partition's pending state: one retry request, under a new run key.
    with database.connection() as conn:
        record_memory_error(conn, first_memory, "HTTP 500 from the LLM")
    retry = _tick(api_inbox_sensor, instance, settings, cursor=same.cursor)
    assert _keys(retry) == ["alice"]
    assert retry.run_requests[0].run_key not in {r.run_key for r in first.run_requests}

    # Distilled memories leave the inbox, and the cursor forgets their partition.
    with database.connection() as conn:
        conn.execute("UPDATE memories SET status = 'distilled' WHERE user_id = 'alice'")
    done = _tick(api_inbox_sensor, instance, settings, cursor=retry.cursor)
    assert done.run_requests == []
    assert set(json.loads(done.cursor)) == {f"{NEXT_DAY}|bob"}


def test_a_tick_requests_one_run_per_user_covering_all_their_new_days(settings: Settings, database: Database) -> None:
    """``memory add`` several times between two ticks, over several days: one run per user, not per memory or day."""
    for minute in range(4):
        add_exchange(database, "alice", f"I tried recipe number {minute}.", DAY, minute=minute)
    add_exchange(database, "alice", "I baked bread.", NEXT_DAY)
    add_exchange(database, "bob", "I like tea.", NEXT_DAY)
    instance = new_instance()

    first = _tick(api_inbox_sensor, instance, settings)

    assert _keys(first) == ["alice", "bob"]
    assert [_days(r) for r in first.run_requests] == [[str(DAY), str(NEXT_DAY)], [str(NEXT_DAY)]]
    _run_requested(instance, settings, first)
    # Each requested run did all of its user's work: nothing is left pending, nothing asked again.
    assert fetch_all(database, "SELECT DISTINCT status FROM memories") == [("distilled",)]
    assert [run.tags["dagster/partition"] for run in instance.get_runs()] == ["bob", "alice"]
    assert _tick(api_inbox_sensor, instance, settings, cursor=first.cursor).run_requests == []

    # New work on one day only: that user's run covers that day, not the ones already done.
    add_exchange(database, "alice", "I baked a cake.", NEXT_DAY, minute=5)
    # Even when it was created in the same second as the one the run finished (a signature made of
    # counts and creation times took it for the state already run: CI saw it once).
    with database.connection() as conn:
        conn.execute("UPDATE memories SET created_at = (SELECT created_at FROM memories WHERE content LIKE "
                     "'%%baked bread%%') WHERE content LIKE '%%baked a cake%%'")
    again = _tick(api_inbox_sensor, instance, settings, cursor=first.cursor)
    assert _keys(again) == ["alice"] and _days(again.run_requests[0]) == [str(NEXT_DAY)]


def test_a_user_whose_memories_were_all_forgotten_leaves_the_partitions(
        settings: Settings, database: Database, drop_dir: Path) -> None:
    alice = [add_exchange(database, "alice", "I live in Berlin.", DAY),
             add_exchange(database, "alice", "I like tea.", NEXT_DAY)]
    add_exchange(database, "bob", "I like coffee.", DAY)
    with database.connection() as conn:  # carol had data once, then forgot it all (deleted, not hidden)
        carol = add_exchange(database, "carol", "I have a cat.", DAY)
        forget_memories(conn, user_id="carol", memory_ids=[carol], actor="test")
    # dave's exchanges are still in a drop file; erin's run is on its way: neither has a row yet.
    _drop(drop_dir, "dave.jsonl", _line("dave", "I play chess.", "2026-03-14") + "\n")
    instance = new_instance("alice", "bob", "carol", "dave", "erin")
    instance.add_run(dg.DagsterRun(job_name="memory_job", run_id=str(uuid.uuid4()),
                                   status=dg.DagsterRunStatus.STARTED, tags={"dagster/partition": "erin"}))

    first = _tick(drop_folder_sensor, instance, settings)
    assert _deleted_users(first) == ["carol"]
    _apply_partition_requests(instance, first)
    assert instance.get_dynamic_partitions(users_partitions.name) == ["alice", "bob", "dave", "erin"]

    # Alice forgets one memory, then (softly) the other: only then does she leave the view.
    with database.connection() as conn:
        forget_memories(conn, user_id="alice", memory_ids=alice[:1], actor="test")
    assert _deleted_users(_tick(drop_folder_sensor, instance, settings, cursor=first.cursor)) == []
    with database.connection() as conn:
        forget_memories(conn, user_id="alice", memory_ids=alice[1:], actor="test", soft=True)
    second = _tick(drop_folder_sensor, instance, settings, cursor=first.cursor)
    assert _deleted_users(second) == ["alice"]
    _apply_partition_requests(instance, second)
    assert "alice" not in instance.get_dynamic_partitions(users_partitions.name)


# --- turns ---------------------------------------------------------------------------------------


def test_turns_sensor_requests_warmth_runs_for_pending_turns(settings: Settings, database: Database) -> None:
    today = datetime.now(UTC).date()
    with database.connection() as conn:
        _, recalled = seed_memory_with_distillation(conn, user_id="alice", exchange="User: I live in Berlin.\nAssistant: ok",
                                                    distillation="User lives in Berlin.")
        insert_turn(conn, user_id="alice", user_message="Where do I live?", assistant_message="Berlin.",
                    recalled_ids=[recalled])
    instance = new_instance()

    first = _tick(turns_sensor, instance, settings)

    assert _keys(first) == ["alice"] and _days(first.run_requests[0]) == [str(today)]
    assert first.run_requests[0].run_key.startswith("turns:alice:")
    assert _added_users(first) == ["alice"]
    _apply_partition_requests(instance, first)
    assert _tick(turns_sensor, instance, settings, cursor=first.cursor).run_requests == []

    with database.connection() as conn:
        insert_turn(conn, user_id="alice", user_message="And my job?", assistant_message="I don't know.",
                    recalled_ids=[])
    second = _tick(turns_sensor, instance, settings, cursor=first.cursor)
    assert _keys(second) == ["alice"]
    assert second.run_requests[0].run_key != first.run_requests[0].run_key


def test_sensors_target_the_right_jobs() -> None:
    assert drop_folder_sensor.job_name == "memory_job"
    assert api_inbox_sensor.job_name == "memory_job"
    assert turns_sensor.job_name == "warmth_job"


# --- run failures --------------------------------------------------------------------------------


def test_run_failure_sensor_sends_one_alert_naming_the_run(settings: Settings, database: Database,
                                                           openai_server: FakeOpenAIServer) -> None:
    instance = new_instance("alice")
    add_missing_partitions(instance, [("alice", DAY)])
    # A run whose database is unreachable fails for real.
    failed = dg.materialize([raw_exchanges], partition_key="alice", tags=day_tags([DAY]), instance=instance,
                            resources={"postgres": PostgresResource.from_settings(settings, database_url="postgresql://yak@127.0.0.1:1/none")},
                            raise_on_error=False)
    assert not failed.success
    webhook = f"http://127.0.0.1:{openai_server.port}/hooks/yak"
    alerts = AlertsResource.from_settings(settings, error_webhook=webhook)
    # A context manager: the alerts resource nests the postgres one, which Dagster opens as a generator.
    with dg.build_run_status_sensor_context(
        sensor_name=run_failure_alert_sensor.name, dagster_event=failed.get_run_failure_event(),
        dagster_instance=instance, dagster_run=failed.dagster_run, resources={"alerts": alerts},
    ) as status_context:
        context = status_context.for_run_failure()
        run_failure_alert_sensor(context)
        run_failure_alert_sensor(context)  # the same alert type within the window is sent once

    posts = [r.body for r in openai_server.requests if r.path == "/hooks/yak"]
    assert len(posts) == 1
    assert posts[0]["content"].startswith("[yak error] run_failed")
    assert failed.run_id[:8] in posts[0]["content"]
    fields = {f["name"]: f["value"] for f in posts[0]["embeds"][0]["fields"]}
    assert failed.run_id in fields["ids"] and "alice" in fields["ids"]
    assert fetch_all(database, "SELECT alert_type, suppressed FROM alert_state") == [("run_failed", 1)]
