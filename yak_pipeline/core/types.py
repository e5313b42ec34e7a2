"""The vocabulary every layer shares: tiers, statuses and user-id validation."""

from __future__ import annotations

import re
from typing import Final, Literal, get_args

Tier = Literal["core", "medium", "low"]
MemoryStatus = Literal["pending", "distilled", "failed"]
DistillationStatus = Literal["active", "review", "rejected", "merged"]
MemorySource = Literal["api", "drop_folder", "import"]
# What kind of thing a memory says (issue 39): how the user wants to be answered, what they prefer,
# a lasting fact, or something that happened (or will) on a day.
MemoryType = Literal["instruction", "preference", "fact", "event"]

TIERS: Final[tuple[Tier, ...]] = get_args(Tier)
MEMORY_STATUSES: Final[tuple[MemoryStatus, ...]] = get_args(MemoryStatus)
DISTILLATION_STATUSES: Final[tuple[DistillationStatus, ...]] = get_args(DistillationStatus)
MEMORY_SOURCES: Final[tuple[MemorySource, ...]] = get_args(MemorySource)
MEMORY_TYPES: Final[tuple[MemoryType, ...]] = get_args(MemoryType)

# A user id is a Dagster partition key, and a user's day is written "2026-01-02|alice" (the
# sensors' cursor, the quality gate's failing days, old runs' multi-partition keys), so it never
# holds "|"; the same pattern is a CHECK constraint in sql/001.
USER_ID_PATTERN: Final[str] = r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$"
_USER_ID_RE: Final = re.compile(USER_ID_PATTERN)


class InvalidUserId(ValueError):
    """A user id that does not match :data:`USER_ID_PATTERN`."""


def validate_user_id(user_id: object) -> str:
    """Return ``user_id`` if it is a valid Yak user id, else raise :class:`InvalidUserId`."""
    if not isinstance(user_id, str) or not _USER_ID_RE.fullmatch(user_id):
        raise InvalidUserId(
            f"invalid user id {user_id!r}: use 1-64 letters, digits, '.', '_', '@' or '-', starting with a letter or digit"
        )
    return user_id
