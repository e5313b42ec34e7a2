"""The nightly schedules: warmth re-evaluation of the last 7 days at 02:00, recall indexes at 03:00 (local time)."""

from datetime import datetime, timedelta, timezone

import dagster as dg

from yak_pipeline.defs.automation.jobs import recall_index_job, warmth_job
from yak_pipeline.defs.partitions import days_partitions, partition_key, users_partitions

NIGHTLY_DAYS = 7


def nightly_run_requests(users: list[str], scheduled_for: datetime, days: int = NIGHTLY_DAYS,
                         known_days: set[str] | None = None) -> list[dg.RunRequest]:
    """One nightly warmth run per user and day of the last ``days`` days (UTC dates); with
    ``known_days``, only days that are partitions (a day without any exchange or turn has none
    and nothing to re-evaluate)."""
    # Partitions are UTC days: 02:00 in a zone east of UTC+2 (Tokyo, Sydney) is still the previous
    # UTC day, whose next day has no partition yet, so the local date would request a missing one.
    today = scheduled_for.astimezone(timezone.utc).date()
    requests = []
    for user_id in sorted(users):
        for back in range(days):
            day = today - timedelta(days=back)
            if known_days is not None and day.isoformat() not in known_days:
                continue
            key = partition_key(user_id, day)
            requests.append(dg.RunRequest(
                run_key=f"nightly:{today.isoformat()}:{key}",
                partition_key=key,
                run_config={"ops": {"warmth": {"config": {"nightly": True, "days": days}}}},
                tags={"yak/trigger": "nightly"},
            ))
    return requests


def nightly_warmth_schedule(timezone: str) -> dg.ScheduleDefinition:
    """The nightly warmth schedule at 02:00 in ``timezone`` (``YAK_TIMEZONE``, passed in by
    ``definitions.py`` so nothing reads the settings when this module is imported)."""

    @dg.schedule(name="nightly_warmth_schedule", job=warmth_job, cron_schedule="0 2 * * *",
                 execution_timezone=timezone, default_status=dg.DefaultScheduleStatus.RUNNING)
    def nightly_warmth(context: dg.ScheduleEvaluationContext) -> list[dg.RunRequest] | dg.SkipReason:
        """At 02:00 in YAK_TIMEZONE: re-evaluate warmth over the last 7 days for every user,
        including memories that were recalled but never evaluated."""
        users = context.instance.get_dynamic_partitions(users_partitions.name)
        if not users:
            return dg.SkipReason("no users yet")
        scheduled = context.scheduled_execution_time or datetime.now().astimezone()
        known_days = set(context.instance.get_dynamic_partitions(days_partitions.name))
        return nightly_run_requests(users, scheduled, known_days=known_days) or dg.SkipReason("no recent days with data")

    return nightly_warmth


def nightly_recall_index_schedule(timezone: str) -> dg.ScheduleDefinition:
    """The nightly recall-index schedule at 03:00 in ``timezone`` (``YAK_TIMEZONE``)."""

    @dg.schedule(name="nightly_recall_index_schedule", job=recall_index_job, cron_schedule="0 3 * * *",
                 execution_timezone=timezone, default_status=dg.DefaultScheduleStatus.RUNNING)
    def nightly_recall_index(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        """At 03:00 in YAK_TIMEZONE: their own recall indexes for users who have grown past the threshold."""
        day = (context.scheduled_execution_time or datetime.now().astimezone()).date()
        return dg.RunRequest(run_key=f"recall-index:{day.isoformat()}", tags={"yak/trigger": "nightly"})

    return nightly_recall_index
