"""Sensors: the drop folder, the API inbox, pending turns, and failed runs.

They detect work and request runs; the runs do it (drop-folder files are stored by the
``raw_exchanges`` asset of the runs requested for them, so the lineage shows where rows came from).

A tick requests one run per user (the user is the partition): it covers every day of that user
whose pending state changed, named in the run's ``yak/days`` tag (``defs.partitions``), so
``memory add`` ten times in a second is one run, not ten. Each request's ``run_key`` names the
user and a signature of those days' pending states, so a state is run once however many ticks
see it; the cursor keeps each user's day's signature last requested (``2026-01-02|alice``).
"""

import hashlib
import json
from collections.abc import Sequence
from datetime import date

import dagster as dg

from yak_pipeline.defs.automation.jobs import memory_job, warmth_job
from yak_pipeline.defs.exchanges.assets import DROP_FILES_TAG
from yak_pipeline.defs.partitions import (
    day_tags,
    forgotten_users,
    missing_partition_requests,
    runs_by_user,
    users_partitions,
)
from yak_pipeline.defs.resources import AlertsResource, PostgresResource
from yak_pipeline.services.discovery import discover_work

# The daemon evaluates sensors in a loop that runs every 5 s at most; an interval of 5 s made a
# sensor skip every other pass (its last tick started a little after its loop pass began), so
# it ticked every ~10 s. A shorter minimum lets every pass tick it: every ~5 s.
SENSOR_INTERVAL_SECONDS = 1


# The tag Dagster gives a partitioned run, naming its partition (the user, "alice").
PARTITION_TAG = "dagster/partition"
# A run in one of these states has not finished its partition's work yet.
_IN_FLIGHT = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
              dg.DagsterRunStatus.STARTED]


def _users_in_flight(context: dg.SensorEvaluationContext, *, prefix: str | None = None) -> set[str]:
    """Users with a run still queued or running: of any job, or (``prefix``) memory runs this sensor requested."""
    filters = (dg.RunsFilter(statuses=_IN_FLIGHT) if prefix is None else
               dg.RunsFilter(job_name=memory_job.name, statuses=_IN_FLIGHT, tags={"yak/trigger": prefix}))
    return {run.tags[PARTITION_TAG] for run in context.instance.get_runs(filters=filters) if PARTITION_TAG in run.tags}


def _cursor_key(user_id: str, day: date) -> str:
    # The earlier user × day partition key's form, so a cursor written before still reads.
    return f"{day.isoformat()}|{user_id}"


def _requests(
    context: dg.SensorEvaluationContext,
    partitions: dict,
    prefix: str,
    drop_files: dict | None = None,
    in_flight: set[str] | frozenset[str] = frozenset(),
    forgotten: Sequence[str] = (),
) -> dg.SensorResult:
    """One run request per user with days whose pending state changed since the cursor, plus new
    users (and the deletion of ``forgotten`` ones).

    The run's ``yak/days`` tag names those days (the planner ``yak process`` uses too,
    ``defs.partitions.runs_by_user``); the drop files of those days go in its ``yak/drop_files``
    tag, for its ``raw_exchanges`` to store. A user in ``in_flight`` is left to their run, which
    changes their pending state as it stores; once the run is done, the state is compared with the
    one last requested (kept in the cursor), so work the run left asks for a new run then.
    """
    previous: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    current: dict[str, str] = {}
    changed: dict[tuple, str] = {}
    for (user_id, day), (_, signature) in partitions.items():
        key = _cursor_key(user_id, day)
        if user_id in in_flight:
            if key in previous:
                current[key] = previous[key]
            continue
        current[key] = signature
        if previous.get(key) != signature:
            changed[(user_id, day)] = signature
    requests = []
    for user_id, days in runs_by_user(changed):
        state = "\0".join(f"{day.isoformat()}:{changed[(user_id, day)]}" for day in days)
        tags = {"yak/trigger": prefix, **day_tags(days)}
        files = sorted({name for day in days for name in (drop_files or {}).get((user_id, day), [])})
        if files:
            tags[DROP_FILES_TAG] = json.dumps(files)
        run_key = f"{prefix}:{user_id}:{hashlib.sha256(state.encode()).hexdigest()[:16]}"
        requests.append(dg.RunRequest(run_key=run_key, partition_key=user_id, tags=tags))
    partition_requests: list = missing_partition_requests(context.instance, partitions)
    if forgotten:
        partition_requests.append(users_partitions.build_delete_request(list(forgotten)))
    return dg.SensorResult(
        run_requests=requests,
        # New users are added in the same tick as the runs that need them.
        dynamic_partitions_requests=partition_requests,
        cursor=json.dumps(current, sort_keys=True),
        skip_reason=None if requests else "no new pending work",
    )


@dg.sensor(job=memory_job, minimum_interval_seconds=SENSOR_INTERVAL_SECONDS, default_status=dg.DefaultSensorStatus.RUNNING)
def drop_folder_sensor(context: dg.SensorEvaluationContext, postgres: PostgresResource) -> dg.SensorResult:
    """Detects ready drop-folder files and requests a memory run for each user whose days they hold,
    naming the files in the run's ``yak/drop_files`` tag; the run's ``raw_exchanges`` stores them.
    The sensor stores nothing: it only reads and parses the files, and finishes at once those that
    hold nothing to store (unreadable ones go to failed/ with an .error.txt). Days with pending
    drop-folder memories (a failed run) are requested again too, once no run of this sensor for
    that user is still queued or running (a run storing a large file changes its days' pending
    state for minutes: that is not new work).

    It also removes the partition of a user whose memories and turns were all forgotten (and who
    has no drop file waiting and no run going), so the UI lists only users with data."""
    db = postgres.database()
    found = discover_work(db, drop_dir=postgres.settings().resolved_drop_dir, drop_folder=True)
    found.claimed.log_to(context.log)
    # Users whose data is on its way keep their partition even with no live row yet.
    keep = {user_id for user_id, _ in found.drop_files} | found.users | _users_in_flight(context)
    with db.connection() as conn:
        forgotten = forgotten_users(context.instance, conn, keep=keep)
    if forgotten:
        context.log.info("removing the partitions of users whose memories were all forgotten: %s",
                         ", ".join(forgotten))
    return _requests(context, found.memory_partitions, "drop", found.drop_files,
                     in_flight=_users_in_flight(context, prefix="drop"), forgotten=forgotten)


@dg.sensor(job=memory_job, minimum_interval_seconds=SENSOR_INTERVAL_SECONDS, default_status=dg.DefaultSensorStatus.RUNNING)
def api_inbox_sensor(context: dg.SensorEvaluationContext, postgres: PostgresResource) -> dg.SensorResult:
    """Requests one memory run per user with pending memories posted through the API, covering
    all their days with new pending work (ten ``memory add`` calls between two ticks: one run)."""
    found = discover_work(postgres.database(), drop_dir=None, drop_folder=False)
    return _requests(context, found.memory_partitions, "inbox")


@dg.sensor(job=warmth_job, minimum_interval_seconds=SENSOR_INTERVAL_SECONDS, default_status=dg.DefaultSensorStatus.RUNNING)
def turns_sensor(context: dg.SensorEvaluationContext, postgres: PostgresResource) -> dg.SensorResult:
    """Requests one warmth run per user with pending turns, covering all their days with new ones."""
    found = discover_work(postgres.database(), drop_dir=None)
    return _requests(context, found.turn_partitions, "turns")


@dg.run_failure_sensor(default_status=dg.DefaultSensorStatus.RUNNING)
def run_failure_alert_sensor(context: dg.RunFailureSensorContext, alerts: AlertsResource) -> None:
    """Sends a ``run_failed`` alert naming the run, its job and partition (the user), and the error."""
    run = context.dagster_run
    error = context.failure_event.message if context.failure_event else "unknown error"
    alerts.alerter().alert("run_failed", f"run {run.run_id[:8]} of {run.job_name} failed",
                           ids=(run.run_id, run.tags.get("dagster/partition", "")), error=error)
