"""Import a history file: tell its format, store its exchanges, remember how far a session was read.

Shared by ``yak import`` and the drop folder (:mod:`yak_pipeline.ingestion.claim`). Storing is
idempotent on each exchange's content hash, so importing the same file twice adds nothing. A
Claude Code transcript that grew since it was last imported is read from where that import
stopped (``import_cursors``, sql/011), provided what was read then is unchanged: exchanges
forgotten since do not come back. Exchanges are stored in batches, each its own transaction,
so a long import shows progress and an interrupted one keeps what it stored; the cursor moves
only once every batch is in.
"""

from __future__ import annotations

import glob
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path

from yak_pipeline.ingestion.drop_folder import ERROR_FILE_SUFFIX, failed_dir, quarantine_records
from yak_pipeline.ingestion.formats.claude_code_sessions import prefix_sha256, session_id_of
from yak_pipeline.ingestion.formats.exchange_records import RejectedRecord
from yak_pipeline.ingestion.formats.history_files import ParsedHistory, detect_format, parse_history_file
from yak_pipeline.ingestion.records import exchange_partition, ingest_records
from yak_pipeline.store.database import Database
from yak_pipeline.store.import_cursors import ImportCursor, get_import_cursor, save_import_cursor

DEFAULT_BATCH_SIZE = 500

# ``(exchanges stored or found so far, exchanges in the file)`` after each batch.
Progress = Callable[[int, int], None]


@dataclass
class HistoryImport:
    """What importing one file did: the file's format, and what became of each of its exchanges."""

    name: str
    format: str | None
    stored: int = 0
    duplicates: int = 0
    # Exchanges stored unfinished by an earlier import, updated in place now that they grew.
    updated: int = 0
    skipped: int = 0
    rejected: list[RejectedRecord] = field(default_factory=list)
    fatal: str | None = None
    # Why the file is damaged (ParsedHistory.damaged): what was whole is stored all the same.
    damaged: str | None = None
    # Bad records an earlier import of the same file quarantined already (not written again).
    already_quarantined: int = 0
    users: set[str] = field(default_factory=set)
    first: datetime | None = None
    last: datetime | None = None
    partitions: set[tuple[str, date]] = field(default_factory=set)
    # Bytes at the start of a grown session transcript that an earlier import had read.
    resumed_at: int = 0
    quarantine_suffix: str = ".jsonl"
    quarantined_to: str | None = None

    def summary(self) -> dict:
        """The outcome as plain JSON values (``yak import --json``)."""
        return {"file": self.name, "format": self.format, "stored": self.stored, "duplicates": self.duplicates,
                "updated": self.updated,
                "skipped": self.skipped, "quarantined": len(self.rejected),
                "already_quarantined": self.already_quarantined, "damaged": self.damaged, "error": self.fatal,
                "users": sorted(self.users), "first": self.first.isoformat() if self.first else None,
                "last": self.last.isoformat() if self.last else None, "resumed_at_byte": self.resumed_at,
                "quarantined_to": self.quarantined_to}


@dataclass
class HistoryRead:
    """A history file read and parsed, nothing stored: what it yielded (its format in
    ``parsed.format``), and where a grown Claude Code transcript resumed (``session_key`` names
    its import cursor)."""

    parsed: ParsedHistory
    session_key: str | None = None
    resume_at: int = 0

    def partitions(self, received: datetime) -> set[tuple[str, date]]:
        """The (user, UTC day) partitions its exchanges will be stored in, ``received`` being now."""
        return {key for record in self.parsed.records
                if (key := exchange_partition(record, received)) is not None}


def read_history(db: Database, name: str, data: bytes, *, user_id: str | None) -> HistoryRead:
    """Tell ``data``'s format and parse it for ``user_id``, resuming a grown session where its last
    import stopped (the cursor is read, not moved); nothing is stored."""
    kind = detect_format(name, data)
    session_key, resume_at = None, 0
    if kind == "claude_code" and user_id is not None:
        session = session_id_of(data)
        if session is not None:
            session_key = f"claude-code:{session}"
            with db.connection() as conn:
                cursor = get_import_cursor(conn, user_id, session_key)
            if (cursor is not None and cursor.resume_at <= len(data)
                    and prefix_sha256(data, cursor.resume_at) == cursor.prefix_sha256):
                resume_at = cursor.resume_at
    parsed = parse_history_file(name, data, user_id=user_id, resume_at=resume_at, detected=kind)
    return HistoryRead(parsed, session_key, resume_at)


def import_history(db: Database, name: str, data: bytes, *, user_id: str | None, source: str,
                   source_ref: str | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
                   on_progress: Progress | None = None) -> HistoryImport:
    """Parse ``data`` (a file called ``name``) and store its exchanges for ``user_id``.

    ``user_id`` is the user of exports (which name none) and of Yak records that name none;
    without it an export is refused (``fatal``). ``source`` is the memories' source (``import``,
    ``drop_folder``). Records the parser or the database refuses are in ``rejected``, for the
    caller to quarantine; nothing is moved or written to disk here.
    """
    read = read_history(db, name, data, user_id=user_id)
    parsed, session_key, resume_at = read.parsed, read.session_key, read.resume_at
    result = HistoryImport(name, parsed.format, skipped=parsed.skipped, rejected=list(parsed.rejected),
                           fatal=parsed.fatal, damaged=parsed.damaged, resumed_at=resume_at,
                           quarantine_suffix=parsed.quarantine_suffix)
    if parsed.fatal is not None:
        return result
    records = parsed.records
    for record in records:
        result.users.add(record.user_id)
        when = record.occurred_at
        if when is not None:
            result.first = when if result.first is None else min(result.first, when)
            result.last = when if result.last is None else max(result.last, when)
    done = 0
    for start in range(0, len(records), batch_size):
        batch = records[start:start + batch_size]
        report = ingest_records(db, batch, source=source, source_ref=source_ref or name)
        result.stored += len(report.stored)
        result.duplicates += len(report.duplicates)
        result.updated += len(report.grown)
        result.rejected += report.rejected
        result.partitions |= report.partitions
        done += len(batch)
        if on_progress is not None:
            on_progress(done, len(records))
    if session_key is not None and parsed.session is not None and user_id is not None:
        with db.connection() as conn:
            save_import_cursor(conn, user_id, session_key, ImportCursor(
                parsed.session.resume_at, prefix_sha256(data, parsed.session.resume_at)))
    return result


def already_quarantined(name: str, drop_dir: Path) -> str:
    """The records earlier imports of file ``name`` quarantined (``failed/<stem>.rejected*``), as one text:
    importing the same bad lines again must not pile up copies of them for ``yak queue status``."""
    directory = failed_dir(drop_dir)
    stem = name[: len(name) - len(Path(name).suffix)]
    if not directory.is_dir():
        return ""
    return "\n".join(path.read_text(encoding="utf-8", errors="replace")
                     for path in sorted(directory.glob(f"{glob.escape(stem)}.rejected*"))
                     if not path.name.endswith(ERROR_FILE_SUFFIX))


def quarantine_import(result: HistoryImport, drop_dir: Path) -> None:
    """Keep the records an import rejected in the drop folder's ``failed/``, with their reasons,
    where ``yak queue status`` lists them (the imported file itself stays where it is)."""
    kept = already_quarantined(result.name, drop_dir)
    fresh = [record for record in result.rejected if not (record.raw.strip() and record.raw in kept)]
    result.already_quarantined += len(result.rejected) - len(fresh)
    result.rejected = fresh
    if result.rejected:
        path = quarantine_records(result.name, drop_dir, result.rejected, suffix=result.quarantine_suffix)
        result.quarantined_to = str(path)
