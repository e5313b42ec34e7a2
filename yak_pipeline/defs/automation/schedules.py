"""The nightly schedules: warmth re-evaluation of the last 7 days at 02:00, recall indexes at 03:00 (local time)."""

from datetime import UTC, date, datetime, timedelta

import dagster as dg

from yak_pipeline.defs.automation.jobs import recall_index_job, warmth_job
from yak_pipeline.defs.partitions import USERS_PARTITIONS, window_tags

NIGHTLY_DAYS = 7


def nightly_window(scheduled_for: datetime, days: int = NIGHTLY_DAYS) -> tuple[date, date]:
    """The UTC days the nightly pass re-evaluates: the last ``days``, ending today (UTC)."""
    # Days are UTC days: 02:00 in a zone east of UTC+2 (Tokyo, Sydney) is still the previous UTC
    # day, whose next day has no data yet, so the local date would look one day ahead.
    today = scheduled_for.astimezone(UTC).date()
    return today - timedelta(days=days - 1), today


def nightly_run_requests(users: list[str], scheduled_for: datetime, days: int = NIGHTLY_DAYS) -> list[dg.RunRequest]:
    """One nightly warmth run per user, over the days of the last ``days`` (UTC) holding their turns
    (the run's ``yak/since``/``yak/until`` tags, ``defs.partitions``)."""
    since, until = nightly_window(scheduled_for, days)
    return [dg.RunRequest(
        run_key=f"nightly:{until.isoformat()}:{user_id}",
        partition_key=user_id,
        run_config={"ops": {"warmth": {"config": {"nightly": True, "days": days}}}},
        tags={"yak/trigger": "nightly", **window_tags(since, until)},
    ) for user_id in sorted(users)]


def nightly_warmth_schedule(timezone: str) -> dg.ScheduleDefinition:
    """The nightly warmth schedule at 02:00 in ``timezone`` (``YAK_TIMEZONE``, passed in by
    ``definitions.py`` so nothing reads the settings when this module is imported)."""

    @dg.schedule(name="nightly_warmth_schedule", job=warmth_job, cron_schedule="0 2 * * *",
                 execution_timezone=timezone, default_status=dg.DefaultScheduleStatus.RUNNING)
    def nightly_warmth(context: dg.ScheduleEvaluationContext) -> list[dg.RunRequest] | dg.SkipReason:
        """At 02:00 in YAK_TIMEZONE: re-evaluate warmth over the last 7 days, one run per user,
        including memories that were recalled but never evaluated. A user without turns in those
        days gets a run that finds nothing to do (about a second): the schedule does not read
        the database, so its evaluation stays as cheap and testable as a sensor-free one."""
        users = context.instance.get_dynamic_partitions(USERS_PARTITIONS)
        if not users:
            return dg.SkipReason("no users yet")
        return nightly_run_requests(list(users), context.scheduled_execution_time or datetime.now().astimezone())

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
