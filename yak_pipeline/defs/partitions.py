"""User × day partitions of the exchange-driven assets (DESIGN §5)."""

from __future__ import annotations

from datetime import date

import dagster as dg

from yak_pipeline.services.ingest import EARLIEST_EXCHANGE_DATE

USER_DIMENSION = "user"
DATE_DIMENSION = "date"

users_partitions = dg.DynamicPartitionsDefinition(name="users")
"""One partition per user id; the sensors add users the first time they see them."""

days_partitions = dg.DailyPartitionsDefinition(
    start_date=EARLIEST_EXCHANGE_DATE.isoformat(),
    timezone="UTC",
    # Today's exchanges belong to today's partition while the day is still running.
    end_offset=1,
)
"""One partition per UTC day of the exchange (``occurred_at``)."""

exchange_partitions = dg.MultiPartitionsDefinition({DATE_DIMENSION: days_partitions, USER_DIMENSION: users_partitions})
"""Keys look like ``2026-01-02|alice``: dimensions are ordered by name, so user ids never hold ``|``."""


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
