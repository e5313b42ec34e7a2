"""User × day partitions of the exchange-driven assets (DESIGN §5), both growing with the data.

The day dimension is dynamic, not a ``DailyPartitionsDefinition``: a daily dimension needs a
start date, and no start fits everyone. Starting where exchanges may start (2000) made a fresh
UI show "9,819 of 9,824 missing, 0% filled"; a recent start would refuse imported history.
Instead the sensors and ``yak process`` add a day the first time an exchange or turn of that
UTC day arrives (as they add users), so the UI lists exactly the days that hold data and a
backfill can pick any of them. Keys are unchanged (``2026-01-02|alice``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import date

import dagster as dg

USER_DIMENSION = "user"
DATE_DIMENSION = "date"

users_partitions = dg.DynamicPartitionsDefinition(name="users")
"""One partition per user id; the sensors add users the first time they see them."""

days_partitions = dg.DynamicPartitionsDefinition(name="days")
"""One partition per UTC day (``YYYY-MM-DD``) with exchanges or turns; added like users."""

exchange_partitions = dg.MultiPartitionsDefinition({DATE_DIMENSION: days_partitions, USER_DIMENSION: users_partitions})
"""Keys look like ``2026-01-02|alice``: dimensions are ordered by name, so user ids never hold ``|``."""


def missing_partition_requests(instance: dg.DagsterInstance,
                               keys: Iterable[tuple[str, date]]) -> list[dg.AddDynamicPartitionsRequest]:
    """Requests adding the users and days of ``keys`` the instance does not know yet (sorted)."""
    keys = list(keys)
    requests = []
    for definition, wanted in ((users_partitions, {user for user, _ in keys}),
                               (days_partitions, {day.isoformat() for _, day in keys})):
        new = sorted(wanted - set(instance.get_dynamic_partitions(definition.name)))
        if new:
            requests.append(definition.build_add_request(new))
    return requests


def add_missing_partitions(instance: dg.DagsterInstance, keys: Iterable[tuple[str, date]]) -> None:
    """Add the users and days of ``keys`` the instance does not know yet (``yak process``, ``yak up``)."""
    for request in missing_partition_requests(instance, keys):
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))


def partition_key(user_id: str, day: date) -> dg.MultiPartitionKey:
    """The partition key of a user's day."""
    return dg.MultiPartitionKey({DATE_DIMENSION: day.isoformat(), USER_DIMENSION: user_id})


def partition_parts(key: str | dg.MultiPartitionKey) -> tuple[str, date]:
    """``(user_id, day)`` of a partition key."""
    if not isinstance(key, dg.MultiPartitionKey):
        day_text, user_id = str(key).split("|", 1)
        return user_id, date.fromisoformat(day_text)
    dims = key.keys_by_dimension
    return dims[USER_DIMENSION], date.fromisoformat(dims[DATE_DIMENSION])


def run_partitions(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext) -> list[tuple[str, date]]:
    """``(user_id, day)`` of every partition the run covers: one, or a range's (``yak process`` runs
    each user's pending days as one range, e.g. ``2026-01-02|alice`` … ``2026-03-01|alice``: a
    range of a two-dimensional key holds just those users and days)."""
    return [partition_parts(key) for key in context.partition_keys]


def partitions_label(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext) -> str:
    """The run's partition key, or its range's first and last keys, for messages and alerts."""
    if context.has_partition_key_range:
        keys = context.partition_key_range
        if keys.start != keys.end:
            return f"{keys.start} … {keys.end}"
    return str(context.partition_key)


# The tags Dagster gives a run over a range of partitions (a single-run backfill's).
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
# A user's pending days share a run unless two of them lie more than this many days apart in the
# day dimension: every day of a range is materialized (those without work cheaply), and a run
# costs about a second of start-up.
MAX_IDLE_DAYS_IN_A_RUN = 7


def user_day_ranges(keys: Iterable[tuple[str, date]], days: Sequence[str]) -> list[tuple[str, list[date]]]:
    """Each user's pending days as runs: ``(user, days)``, the first and last day of a run its range's ends.

    ``days`` is the instance's day dimension in its own order — the order days were added, not
    the calendar's (imported history arrives after recent days) — and a range covers every day
    between its ends in that order. A new run starts where more than
    :data:`MAX_IDLE_DAYS_IN_A_RUN` days lie between two pending ones.
    """
    position = {day: index for index, day in enumerate(days)}
    by_user: dict[str, list[date]] = {}
    for user, when in keys:
        by_user.setdefault(user, []).append(when)
    ranges: list[tuple[str, list[date]]] = []
    for user in sorted(by_user):
        current: list[date] = []
        for when in sorted(set(by_user[user]), key=lambda d: position[d.isoformat()]):
            if current and position[when.isoformat()] - position[current[-1].isoformat()] > MAX_IDLE_DAYS_IN_A_RUN:
                ranges.append((user, current))
                current = []
            current.append(when)
        ranges.append((user, current))
    return ranges
