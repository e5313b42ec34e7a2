"""Sensors: the drop folder, the API inbox, pending turns, and failed runs.

Each request's ``run_key`` names the partition and a signature of its pending state, so a
state is run once however many ticks see it; the cursor keeps the signatures last requested.
"""

import json

import dagster as dg

from yak_pipeline.defs.automation.jobs import memory_job, warmth_job
from yak_pipeline.defs.partitions import missing_partition_requests, partition_key
from yak_pipeline.defs.resources import AlertsResource, PostgresResource
from yak_pipeline.services.discovery import discover_work

# The daemon evaluates sensors in a loop that runs every 5 s at most; an interval of 5 s made a
# sensor skip every other pass (its last tick started a little after its loop pass began), so
# it ticked every ~10 s. A shorter minimum lets every pass tick it: every ~5 s.
SENSOR_INTERVAL_SECONDS = 1


def _requests(
    context: dg.SensorEvaluationContext,
    partitions: dict,
    prefix: str,
) -> dg.SensorResult:
    """Run requests for partitions whose pending state changed since the cursor, plus new users."""
    previous: dict[str, str] = json.loads(context.cursor) if context.cursor else {}
    current: dict[str, str] = {}
    requests = []
    for (user_id, day), (_, signature) in sorted(partitions.items(), key=lambda item: (item[0][1], item[0][0])):
        key = partition_key(user_id, day)
        current[str(key)] = signature
        if previous.get(str(key)) != signature:
            requests.append(dg.RunRequest(run_key=f"{prefix}:{key}:{signature}", partition_key=key,
                                          tags={"yak/trigger": prefix}))
    return dg.SensorResult(
        run_requests=requests,
        # New users and days are added in the same tick as the runs that need them.
        dynamic_partitions_requests=missing_partition_requests(context.instance, partitions),
        cursor=json.dumps(current, sort_keys=True),
        skip_reason=None if requests else "no new pending work",
    )


@dg.sensor(job=memory_job, minimum_interval_seconds=SENSOR_INTERVAL_SECONDS, default_status=dg.DefaultSensorStatus.RUNNING)
def drop_folder_sensor(context: dg.SensorEvaluationContext, postgres: PostgresResource) -> dg.SensorResult:
    """Claims ready drop-folder files — parse, store their exchanges, move them to processed/ (or
    failed/ with an .error.txt) — and requests a memory run for each user's day they touched."""
    found = discover_work(postgres.database(), drop_dir=postgres.settings().resolved_drop_dir, drop_folder=True)
    for outcome in found.claimed.files:
        if outcome.error:
            context.log.warning("drop file %s: %s", outcome.name, outcome.error)
        else:
            context.log.info("drop file %s: %d stored, %d duplicates, %d rejected", outcome.name, outcome.stored,
                             outcome.duplicates, outcome.rejected)
    return _requests(context, found.memory_partitions, "drop")


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
