"""Store parsed exchange records as memories: idempotent, scoped, every record accounted for."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

import psycopg

from yak_pipeline.core.exchanges import content_sha256, normalise_exchange_text
from yak_pipeline.core.secrets import redact_secrets
from yak_pipeline.ingestion.formats.exchange_records import ExchangeRecord, RejectedRecord
from yak_pipeline.store.database import Database
from yak_pipeline.store.grown_exchanges import StoredByRef, grow_exchange, memories_by_ref
from yak_pipeline.store.memories import NewExchange, StoredMemory, insert_memories, new_exchange

# An exchange dated earlier is a wrong date, not history (partitions no longer depend on it: the
# day dimension grows with the data, see defs/partitions.py).
EARLIEST_EXCHANGE_DATE = date(2000, 1, 1)
# Clocks and time zones disagree a little; more than a day ahead is a wrong date, not skew.
FUTURE_TOLERANCE = timedelta(days=1)


@dataclass
class IngestReport:
    """What happened to each record: stored, already there, or rejected with a reason."""

    stored: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    # Memories whose exchange grew since it was stored, updated in place (store.grown_exchanges).
    grown: list[str] = field(default_factory=list)
    rejected: list[RejectedRecord] = field(default_factory=list)
    partitions: set[tuple[str, date]] = field(default_factory=set)

    @property
    def users(self) -> set[str]:
        """The users whose exchanges were seen."""
        return {user for user, _ in self.partitions}


def exchange_time(record: ExchangeRecord, received: datetime) -> tuple[datetime, str | None]:
    """When ``record`` happened (its own time, else ``received``) and why that time is refused, if it is.

    The same rule decides where an exchange is stored and which partitions the drop-folder sensor
    asks runs for, so a run is never requested for a day nothing will be stored on.
    """
    when = record.occurred_at or received
    if when.date() < EARLIEST_EXCHANGE_DATE:
        return when, f"occurred_at {when.date()} is before {EARLIEST_EXCHANGE_DATE}"
    if when > received + FUTURE_TOLERANCE:
        return when, f"occurred_at {when.isoformat()} is in the future"
    return when, None


def exchange_partition(record: ExchangeRecord, received: datetime) -> tuple[str, date] | None:
    """The (user, UTC day) partition ``record`` is stored in, or None when its time is refused."""
    when, refused = exchange_time(record, received)
    return None if refused else (record.user_id, when.astimezone(UTC).date())


def _reject(record: ExchangeRecord, reason: str) -> RejectedRecord:
    # The quarantined copy is what storing it would keep: its secrets replaced (a record refused
    # for a bad date must not keep the key it held either; dropped again, it stores the same text).
    raw = json.dumps({"user_id": record.user_id, "content": redact_secrets(record.content).text,
                      "occurred_at": record.occurred_at.isoformat() if record.occurred_at else None})
    return RejectedRecord(line=record.line, raw=raw, reason=reason)


def _source_ref(file_ref: str | None, record_ref: str | None) -> str | None:
    """The file a record came from and, for an export, where in it (``conversations.json#chatgpt:…``)."""
    if record_ref is None:
        return file_ref
    return record_ref if file_ref is None else f"{file_ref}#{record_ref}"


def _stored_by_ref(conn: psycopg.Connection, records: Sequence[ExchangeRecord]) -> dict:
    """The memories already stored for the growing records' refs, by ``(user_id, ref)``."""
    refs: dict[str, list[str]] = {}
    for record in records:
        if record.grows and record.ref is not None:
            refs.setdefault(record.user_id, []).append(record.ref)
    return {(user_id, ref): stored for user_id, user_refs in refs.items()
            for ref, stored in memories_by_ref(conn, user_id, user_refs).items()}


def ingest_records(
    db: Database,
    records: Sequence[ExchangeRecord],
    *,
    source: str,
    source_ref: str | None = None,
    now: datetime | None = None,
) -> IngestReport:
    """Store records as ``pending`` memories in one transaction.

    A record that cannot be stored is rejected with its reason while the others are kept; the
    same exchange twice is stored once (``duplicates``); a record whose answer may still grow
    (``grows``) and whose ref was stored before updates that memory in place (``grown``) instead
    of adding a second one, unless it was forgotten since. ``source_ref`` names the file; a
    record's own ``ref`` (an export's conversation and message) is added to it.

    The new exchanges are stored with one INSERT (``store.memories.insert_memories``): a batch of
    an import costs a few statements, not a few per exchange. Only if the database refuses that
    INSERT (a value it will not take) is the batch stored again one record at a time, a savepoint
    each, to tell which records it refuses.
    """
    report = IngestReport()
    received = now or datetime.now(UTC)
    with db.connection() as conn:
        by_ref = _stored_by_ref(conn, records)
        fresh: list[tuple[ExchangeRecord, NewExchange, datetime]] = []
        for record in records:
            when, refused = exchange_time(record, received)
            if refused is not None:
                report.rejected.append(_reject(record, refused))
                continue
            earlier = by_ref.get((record.user_id, record.ref)) if record.grows else None
            if earlier is not None:
                _grow(conn, db, record, earlier, when, report)
                continue
            try:
                new = new_exchange(user_id=record.user_id, content=record.content, source=source,
                                   occurred_at=when, source_ref=_source_ref(source_ref, record.ref),
                                   secrets=db.secrets)
            except ValueError as exc:  # an empty text, or a secret under YAK_SECRETS=refuse
                report.rejected.append(_reject(record, _reason(exc)))
                continue
            fresh.append((record, new, when))
        stored: Sequence[StoredMemory | None]  # None: refused on its own (quarantined by _insert_one_by_one)
        try:
            with conn.transaction():
                stored = insert_memories(conn, [new for _, new, _ in fresh])
        except _REFUSED:
            stored = _insert_one_by_one(conn, fresh, report)
        for (record, _, when), memory in zip(fresh, stored, strict=True):
            if memory is None:
                continue
            (report.stored if memory.created else report.duplicates).append(str(memory.id))
            report.partitions.add((record.user_id, when.astimezone(UTC).date()))
    return report


# What the database raises for a value it will not store (the rest of the batch is fine).
_REFUSED = (ValueError, psycopg.errors.DataError, psycopg.errors.IntegrityError)


def _reason(exc: Exception) -> str:
    """An error as the one-line reason a rejected record is quarantined with."""
    return " ".join(str(exc).split())[:300]


def _insert_one_by_one(conn: psycopg.Connection, fresh: Sequence[tuple[ExchangeRecord, NewExchange, datetime]],
                       report: IngestReport) -> list[StoredMemory | None]:
    """Store each exchange with its own INSERT and savepoint; those the database refuses are
    rejected (None), the others stored as :func:`insert_memories` would have."""
    stored: list[StoredMemory | None] = []
    for record, new, _ in fresh:
        try:
            with conn.transaction():
                stored.append(insert_memories(conn, [new])[0])
        except _REFUSED as exc:
            report.rejected.append(_reject(record, _reason(exc)))
            stored.append(None)
    return stored


def _grow(conn: psycopg.Connection, db: Database, record: ExchangeRecord, earlier: StoredByRef, when: datetime,
          report: IngestReport) -> None:
    """A growing record whose ref was stored before: update that memory in place if its text grew."""
    # Compared as it would be stored (its secrets replaced), or a secret in it would make
    # every re-import "grow" the exchange again.
    if not earlier.forgotten and earlier.content_sha256 != content_sha256(
            redact_secrets(normalise_exchange_text(record.content)).text):
        try:
            with conn.transaction():
                grew = grow_exchange(conn, earlier.id, user_id=record.user_id, content=record.content,
                                     secrets=db.secrets)
        except ValueError as exc:  # YAK_SECRETS=refuse: the grown text held a secret
            report.rejected.append(_reject(record, _reason(exc)))
            return
        if grew:
            report.grown.append(str(earlier.id))
            report.partitions.add((record.user_id, when.astimezone(UTC).date()))
            return
    # The same text, or forgotten since: forgotten stays forgotten.
    report.duplicates.append(str(earlier.id))
