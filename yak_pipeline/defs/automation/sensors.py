"""Sensors: the drop folder, the API inbox, pending turns, and failed runs.

They detect work and request runs; the runs do it (drop-folder files are stored by the
``raw_exchanges`` asset of the runs requested for them, so the lineage shows where rows came from).

Each request's ``run_key`` names the partition and a signature of its pending state, so a
state is run once however many ticks see it; the cursor keeps the signatures last requested.
"""

import json

import dagster as dg

from yak_pipeline.defs.automation.jobs import memory_job, warmth_job
from yak_pipeline.defs.exchanges.assets import DROP_FILES_TAG
from yak_pipeline.defs.partitions import missing_partition_requests, partition_key
from yak_pipeline.defs.resources import AlertsResource, PostgresResource
from yak_pipeline.services.discovery import discover_work

# The daemon evaluates sensors in a loop that runs every 5 s at most; an interval of 5 s made a
# sensor skip every other pass (its last tick started a little after its loop pass began), so
# it ticked every ~10 s. A shorter minimum lets every pass tick it: every ~5 s.
SENSOR_INTERVAL_SECONDS = 1


# The tag Dagster gives a partitioned run, naming its partition ("2026-03-14|alice").
PARTITION_TAG = "dagster/partition"
# A run in one of these states has not finished its partition's work yet.
_IN_FLIGHT = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
              dg.DagsterRunStatus.STARTED]


def _partitions_in_flight(context: dg.SensorEvaluationContext, prefix: str) -> set[str]:
    """Partition keys of the memory runs this sensor requested that are still queued or running."""
    runs = context.instance.get_runs(filters=dg.RunsFilter(job_name=memory_job.name, statuses=_IN_FLIGHT,
                                                           tags={"yak/trigger": prefix}))
    return {run.tags[PARTITION_TAG] for run in runs if PARTITION_TAG in run.tags}


def _requests(
    context: dg.SensorEvaluationContext,
    partitions: dict,
    prefix: str,
    drop_files: dict | None = None,
    in_flight: set[str] | frozenset[str] = frozenset(),
) -> dg.SensorResult:
    """Run requests for partitions whose pending state changed since the cursor, plus new users.

    A partition with ready drop files gets them in its run's ``yak/drop_files`` tag: that run's
    ``raw_exchanges`` stores them. A partition in ``in_flight`` is left to its run, which changes
    its pending state as it stores; once the run is done, the state is compared with the one last
    requested (kept in the cursor), so work the run left asks for a new run then.
    """
    previous: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    current: dict[str, str] = {}
    requests = []
    for (user_id, day), (_, signature) in sorted(partitions.items(), key=lambda item: (item[0][1], item[0][0])):
        key = partition_key(user_id, day)
        if str(key) in in_flight:
            if str(key) in previous:
                current[str(key)] = previous[str(key)]
            continue
        current[str(key)] = signature
        if previous.get(str(key)) != signature:
            tags = {"yak/trigger": prefix}
            if drop_files and (user_id, day) in drop_files:
                tags[DROP_FILES_TAG] = json.dumps(drop_files[(user_id, day)])
            requests.append(dg.RunRequest(run_key=f"{prefix}:{key}:{signature}", partition_key=key, tags=tags))
    return dg.SensorResult(
        run_requests=requests,
        # New users and days are added in the same tick as the runs that need them.
        dynamic_partitions_requests=missing_partition_requests(context.instance, partitions),
        cursor=json.dumps(current, sort_keys=True),
        skip_reason=None if requests else "no new pending work",
    )


@dg.sensor(job=memory_job, minimum_interval_seconds=SENSOR_INTERVAL_SECONDS, default_status=dg.DefaultSensorStatus.RUNNING)
def drop_folder_sensor(context: dg.SensorEvaluationContext, postgres: PostgresResource) -> dg.SensorResult:
    """Detects ready drop-folder files and requests a memory run for each user's day they hold,
    naming the files in the run's ``yak/drop_files`` tag; the run's ``raw_exchanges`` stores them.
    The sensor stores nothing: it only reads and parses the files, and finishes at once those that
    hold nothing to store (unreadable ones go to failed/ with an .error.txt). Partitions with
    pending drop-folder memories (a failed run) are requested again too, once no run of this
    sensor for that partition is still queued or running (a run storing a large file changes its
    partitions' pending state for minutes: that is not new work)."""
    found = discover_work(postgres.database(), drop_dir=postgres.settings().resolved_drop_dir, drop_folder=True)
    found.claimed.log_to(context.log)
    return _requests(context, found.memory_partitions, "drop", found.drop_files,
                     in_flight=_partitions_in_flight(context, "drop"))


@dg.sensor(job=memory_job, minimum_interval_seconds=SENSOR_INTERVAL_SECONDS, default_status=dg.DefaultSensorStatus.RUNNING)
def api_inbox_sensor(context: dg.SensorEvaluationContext, postgres: PostgresResource) -> dg.SensorResult:
    """Requests a memory run for each user's day with pending memories posted through the API."""
    found = discover_work(postgres.database(), drop_dir=None, drop_folder=False)
    return _requests(context, found.memory_partitions, "inbox")


@dg.sensor(job=warmth_job, minimum_interval_seconds=SENSOR_INTERVAL_SECONDS, default_status=dg.DefaultSensorStatus.RUNNING)
def turns_sensor(context: dg.SensorEvaluationContext, postgres: PostgresResource) -> dg.SensorResult:
    """Requests a warmth run for every user's day with pending turns."""
    found = discover_work(postgres.database(), drop_dir=None)
    return _requests(context, found.turn_partitions, "turns")


@dg.run_failure_sensor(default_status=dg.DefaultSensorStatus.RUNNING)
def run_failure_alert_sensor(context: dg.RunFailureSensorContext, alerts: AlertsResource) -> None:
    """Sends a ``run_failed`` alert naming the run, its job and partition, and the error."""
    run = context.dagster_run
    error = context.failure_event.message if context.failure_event else "unknown error"
    alerts.alerter().alert("run_failed", f"run {run.run_id[:8]} of {run.job_name} failed",
                           ids=(run.run_id, run.tags.get("dagster/partition", "")), error=error)
