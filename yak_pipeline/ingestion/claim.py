"""The drop folder's files: find what they hold (detect), then store them and move them (claim).

Detecting is what the drop-folder sensor does: :func:`plan_drop_files` reads and parses each
ready file, stores nothing, and says which (user, day) partitions its exchanges fall on, so the
sensor can request a run for each. Claiming is what the ``raw_exchanges`` asset of those runs
does (and ``yak process``, and the sensor for a file holding nothing to store): each file is
imported as ``yak import`` imports it (:mod:`yak_pipeline.ingestion.history`: its format told
from its content), for the user of the user folder it sits in, if any. Storing happens before
the file moves, and storing is idempotent on the content hash, so a crash between the two
re-ingests the file as duplicates on the next claim: nothing is lost, nothing is stored twice.
One process claims at a time (:func:`yak_pipeline.store.drop_claims.lock_drop_claims`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from yak_pipeline.ingestion.drop_folder import (
    DropFolderError,
    finish_file,
    list_ready_files_by_user,
    rejection_reason,
)
from yak_pipeline.ingestion.formats.exchange_records import ParsedFile
from yak_pipeline.ingestion.history import import_history, read_history
from yak_pipeline.store.database import Database
from yak_pipeline.store.drop_claims import lock_drop_claims

logger = logging.getLogger(__name__)


@dataclass
class FileOutcome:
    """What became of one file (``name`` is ``user/name`` for a file of a user folder)."""

    name: str
    stored: int
    duplicates: int
    rejected: int
    error: str | None
    moved_to: str | None
    format: str | None = None
    skipped: int = 0
    first_rejection: str | None = None  # where the first rejected record was and why ("line 1: …")

    def rejected_summary(self) -> str:
        """``N rejected``, with the first rejection's place and reason and how many more there are."""
        if not self.first_rejection:
            return f"{self.rejected} rejected"
        more = f"; {self.rejected - 1} more in failed/" if self.rejected > 1 else ""
        return f"{self.rejected} rejected ({self.first_rejection}{more})"


@dataclass
class ClaimReport:
    """All files claimed in one pass and the (user, day) partitions they touched."""

    files: list[FileOutcome] = field(default_factory=list)
    partitions: set[tuple[str, date]] = field(default_factory=set)

    @property
    def stored(self) -> int:
        """New memories stored."""
        return sum(f.stored for f in self.files)

    def log_to(self, log: Any) -> None:
        """One line per file on ``log`` (a logger, or a Dagster context's log): why it failed, or what it stored."""
        for outcome in self.files:
            if outcome.error:
                log.warning("drop file %s: %s", outcome.name, outcome.error)
            else:
                log.info("drop file %s: %d stored, %d duplicates, %s", outcome.name, outcome.stored,
                         outcome.duplicates, outcome.rejected_summary())


def _shown(path: Path, user: str | None) -> str:
    """How a file is named in reports and run tags: ``name``, or ``user/name`` in a user folder."""
    return path.name if user is None else f"{user}/{path.name}"


@dataclass(frozen=True)
class DropFile:
    """A ready file and what it holds: ``signature`` changes whenever the file does."""

    name: str
    signature: str
    partitions: frozenset[tuple[str, date]]


@dataclass
class DropPlan:
    """The ready files of the drop folder, read but not stored.

    ``files`` hold exchanges to store, on the partitions each names; ``nothing_to_store`` are the
    names of files without a storable exchange (unreadable, or every record refused), which no
    partition's run will claim.
    """

    files: list[DropFile] = field(default_factory=list)
    nothing_to_store: list[str] = field(default_factory=list)

    def files_by_partition(self) -> dict[tuple[str, date], list[DropFile]]:
        """For each partition, the files holding its exchanges (in the order they were found)."""
        found: dict[tuple[str, date], list[DropFile]] = {}
        for drop_file in self.files:
            for key in sorted(drop_file.partitions):
                found.setdefault(key, []).append(drop_file)
        return found


def plan_drop_files(db: Database, drop_dir: Path, *, min_age_seconds: float = 2.0, limit: int = 100,
                    now: datetime | None = None) -> DropPlan:
    """Read and parse up to ``limit`` ready files of the drop folder and its user folders; store nothing.

    The database is only read (where a grown Claude Code session was last read up to). A file
    that cannot be read is listed under ``nothing_to_store``, for :func:`claim_drop_files` to
    quarantine with its reason.
    """
    plan = DropPlan()
    received = now or datetime.now(UTC)
    for path, user in list_ready_files_by_user(drop_dir, min_age_seconds=min_age_seconds)[:limit]:
        shown = _shown(path, user)
        try:
            data = path.read_bytes()
            stat = path.stat()
        except OSError:
            plan.nothing_to_store.append(shown)
            continue
        partitions = read_history(db, path.name, data, user_id=user).partitions(received)
        if not partitions:
            plan.nothing_to_store.append(shown)
            continue
        digest = hashlib.sha256(f"{shown}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:16]
        plan.files.append(DropFile(shown, digest, frozenset(partitions)))
    return plan


def claim_drop_files(db: Database, drop_dir: Path, *, min_age_seconds: float = 2.0, limit: int = 100,
                     names: Collection[str] | None = None) -> ClaimReport:
    """Claim up to ``limit`` ready files of the drop folder and its user folders: store, then move each.

    ``names`` (``name`` or ``user/name``, as :func:`plan_drop_files` gives them) claims just those
    files, whatever their age; one no longer there was claimed by another run and is skipped.
    """
    report = ClaimReport()
    with db.connection() as lock:
        lock_drop_claims(lock)  # held until this block ends: the files are claimed one process at a time
        ready = list_ready_files_by_user(drop_dir, min_age_seconds=0 if names is not None else min_age_seconds)
        if names is not None:
            wanted = set(names)
            ready = [(path, user) for path, user in ready if _shown(path, user) in wanted]
        for path, user in ready[:limit]:
            _claim_one(db, drop_dir, path, user, report)
    return report


def _claim_one(db: Database, drop_dir: Path, path: Path, user: str | None, report: ClaimReport) -> None:
    """Import one file for ``user``, then move it out of the drop folder; add what happened to ``report``."""
    shown = _shown(path, user)
    try:
        data = path.read_bytes()
    except OSError as error:
        outcome = None
        parsed = ParsedFile(fatal=f"cannot read the file: {error.strerror or error}")
        suffix = None
    else:
        outcome = import_history(db, path.name, data, user_id=user, source="drop_folder", source_ref=path.name)
        # Records the parser or the database refused are quarantined together.
        parsed = ParsedFile(rejected=tuple(outcome.rejected), fatal=outcome.fatal)
        suffix = outcome.quarantine_suffix
    stored = outcome.stored if outcome else 0
    duplicates = outcome.duplicates if outcome else 0
    kind, skipped = (outcome.format, outcome.skipped) if outcome else (None, 0)
    first = rejection_reason(path.name, parsed.rejected[0], suffix=suffix) if parsed.rejected else None
    try:
        result = finish_file(path, drop_dir, parsed, quarantine_suffix=suffix)
    except DropFolderError as exc:
        logger.warning("%s", exc)
        report.files.append(FileOutcome(shown, stored, duplicates, len(parsed.rejected), str(exc), None,
                                        kind, skipped, first))
        return
    moved = result.path_processed or result.path_failed
    report.files.append(FileOutcome(shown, stored, duplicates, len(parsed.rejected), parsed.fatal,
                                    str(moved) if moved else None, kind, skipped, first))
    if outcome is not None:
        report.partitions |= outcome.partitions
