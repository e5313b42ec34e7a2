"""User × day partitions of the exchange-driven assets (DESIGN §5), both growing with the data.

The day dimension is dynamic, not a ``DailyPartitionsDefinition``: a daily dimension needs a
start date, and no start fits everyone. Starting where exchanges may start (2000) made a fresh
UI show "9,819 of 9,824 missing, 0% filled"; a recent start would refuse imported history.
Instead the sensors and ``yak process`` add a day the first time an exchange or turn of that
UTC day arrives (as they add users), so the UI lists exactly the days that hold data and a
backfill can pick any of them. Keys are unchanged (``2026-01-02|alice``).
"""

from __future__ import annotations

from collections.abc import Iterable
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
