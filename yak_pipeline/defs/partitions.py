"""Per-user partitions of the exchange-driven assets (DESIGN §5); a run's days are named by its tags.

Why one partition per user, not one per user × day: a ``MultiPartitionsDefinition`` of users and
days shows their cross product, so the UI listed 15 partitions for the examples, 9 of them
"missing" that could never hold data, and every asset "40 % filled". A single dynamic key per
(user, day) would list only days with data, but Dagster runs cover a contiguous *range* of keys
(a backfill of a non-contiguous set is split into one run per range), and dynamic keys are ordered
by when they were added, so one user's days are interleaved with everyone else's: neither "one run
per user per sensor tick" nor a single-run backfill of one user's days would be possible.

So the partition is the user (``alice``), a partition exists exactly while the user has data
(the sensors add users as data arrives and delete forgotten ones), and the days a run covers are
data, not partitions:

- ``yak/days`` (a JSON list of UTC days): exactly those days — the sensors and ``yak process``
  name a user's pending days this way, so one run does all of a user's work;
- ``yak/since`` / ``yak/until`` (UTC days, inclusive): every day of the window holding the
  user's data — a backfill of one user's date range (set them as the backfill's tags);
- neither: every day holding the user's data (a backfill of the whole user).

Data quality (the distillation gate) and the run's figures are still kept per user and day.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import date
from typing import Final

import dagster as dg
import psycopg

from yak_pipeline.store.memories import days_with_data, users_with_data

USERS_PARTITIONS: Final = "users"
"""The users partitions' name, typed ``str`` (the definition's ``name`` is optional: a dynamic
partitions definition can be built from a function instead)."""

users_partitions = dg.DynamicPartitionsDefinition(name=USERS_PARTITIONS)
"""One partition per user id with data; the sensors add users the first time they see them and
delete them once everything of theirs is forgotten. (The name is the user dimension's of the
earlier user × day partitions, so an instance's known users carry over.)"""

# The run tags naming the days a run covers (see the module docstring).
DAYS_TAG = "yak/days"
SINCE_TAG = "yak/since"
UNTIL_TAG = "yak/until"


class RunDaysError(ValueError):
    """A run's day tags cannot be read (set by hand on a backfill, say)."""


def day_tags(days: Iterable[date]) -> dict[str, str]:
    """The tag naming exactly ``days`` as the days of a run."""
    return {DAYS_TAG: json.dumps(sorted({day.isoformat() for day in days}))}


def window_tags(since: date | None, until: date | None) -> dict[str, str]:
    """The tags limiting a run to the days with data in ``since`` … ``until`` (either may be open)."""
    tags = {}
    if since is not None:
        tags[SINCE_TAG] = since.isoformat()
    if until is not None:
        tags[UNTIL_TAG] = until.isoformat()
    return tags


def _day(tags: dict[str, str], name: str) -> date | None:
    raw = tags.get(name)
    if raw is None:
        return None
    try:
        return date.fromisoformat(raw)
    except ValueError:
        raise RunDaysError(f"run tag {name} is {raw!r}, not a day (use YYYY-MM-DD)") from None


def tagged_days(tags: dict[str, str]) -> tuple[list[date] | None, date | None, date | None]:
    """``(days, since, until)`` of a run's tags: the named days (None: not named) and the window."""
    since, until = _day(tags, SINCE_TAG), _day(tags, UNTIL_TAG)
    raw = tags.get(DAYS_TAG)
    if raw is None:
        return None, since, until
    try:
        days = [date.fromisoformat(text) for text in json.loads(raw)]
    except (ValueError, TypeError):
        raise RunDaysError(f"run tag {DAYS_TAG} is {raw!r}, not a JSON list of days (YYYY-MM-DD)") from None
    return days, since, until


def run_partitions(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext,
                   conn: psycopg.Connection) -> list[tuple[str, date]]:
    """``(user_id, day)`` of every day the run covers: for each of its users (one, unless a
    multi-user backfill), the days its tags name, else those with data in its tags' window."""
    try:
        days, since, until = tagged_days(dict(context.run.tags))
    except RunDaysError as exc:
        # A Failure shows in the UI as its one line, not a traceback: a person set the tag by hand.
        raise dg.Failure(description=str(exc), allow_retries=False) from None
    covered: list[tuple[str, date]] = []
    for user_id in context.partition_keys:
        if days is not None:
            covered += [(user_id, day) for day in sorted(set(days))
                        if (since is None or day >= since) and (until is None or day <= until)]
        else:
            covered += days_with_data(conn, user_id=user_id, since=since, until=until)
    return covered


def partitions_label(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext) -> str:
    """The run's user(s) and days as its tags name them, for messages and alerts."""
    users = ", ".join(context.partition_keys)
    try:
        days, since, until = tagged_days(dict(context.run.tags))
    except RunDaysError:
        return users  # the run itself reports the bad tag
    if days:
        first, last = min(days), max(days)
        return f"{users} {first}" if first == last else f"{users} {first} … {last} ({len(set(days))} days)"
    if since or until:
        return f"{users} {since or '…'} … {until or '…'}"
    return f"{users} (every day with data)"


def runs_by_user(keys: Iterable[tuple[str, date]]) -> list[tuple[str, list[date]]]:
    """The run plan the sensors and ``yak process`` share: one run per user, covering each of the
    user's days in ``keys`` (sorted), users in order."""
    by_user: dict[str, set[date]] = {}
    for user_id, day in keys:
        by_user.setdefault(user_id, set()).add(day)
    return [(user_id, sorted(by_user[user_id])) for user_id in sorted(by_user)]


def missing_partition_requests(instance: dg.DagsterInstance,
                               keys: Iterable[tuple[str, date]]) -> list[dg.AddDynamicPartitionsRequest]:
    """A request adding the users of ``(user, day)`` ``keys`` the instance does not know yet (sorted)."""
    new = sorted({user_id for user_id, _ in keys} - set(instance.get_dynamic_partitions(USERS_PARTITIONS)))
    return [users_partitions.build_add_request(new)] if new else []


def add_missing_partitions(instance: dg.DagsterInstance, keys: Iterable[tuple[str, date]]) -> None:
    """Add the users of ``keys`` the instance does not know yet (``yak process``, ``yak up``)."""
    for request in missing_partition_requests(instance, keys):
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))


def forgotten_users(instance: dg.DagsterInstance, conn: psycopg.Connection, *, keep: Iterable[str]) -> list[str]:
    """Users who are partitions but hold no live exchange or turn any more (all forgotten), except
    those in ``keep`` (users whose data is on its way: drop files not stored yet, runs in flight)."""
    keep = set(keep)
    known = [user_id for user_id in instance.get_dynamic_partitions(USERS_PARTITIONS) if user_id not in keep]
    if not known:
        return []
    return sorted(set(known) - users_with_data(conn, known))


def sync_user_partitions(instance: dg.DagsterInstance, conn: psycopg.Connection, *,
                         keep: Iterable[str] = ()) -> None:
    """Make the users partitions match the data: every user with data is one, a forgotten user is
    not (``yak up`` before the UI opens, ``yak process``; the sensors do the same as data changes)."""
    add_missing_partitions(instance, days_with_data(conn))
    for user_id in forgotten_users(instance, conn, keep=keep):
        instance.delete_dynamic_partition(USERS_PARTITIONS, user_id)
