"""Claim drop-folder files: parse, store their exchanges, then move them out of the folder.

Shared by the drop-folder sensor and ``yak process``. Each file is imported as ``yak import``
imports it (:mod:`yak_pipeline.ingestion.history`: its format told from its content),
for the user of the user folder it sits in, if any. Storing happens before the file moves,
and storing is idempotent on the content hash, so a crash between the two re-ingests the file
as duplicates on the next tick: nothing is lost, nothing is stored twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from yak_pipeline.core.exchange_files import ParsedFile
from yak_pipeline.ingestion.drop_folder import DropFolderError, finish_file, list_ready_files_by_user
from yak_pipeline.ingestion.history import import_history
from yak_pipeline.store.database import Database

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


@dataclass
class ClaimReport:
    """All files claimed in one pass and the (user, day) partitions they touched."""

    files: list[FileOutcome] = field(default_factory=list)
    partitions: set[tuple[str, date]] = field(default_factory=set)

    @property
    def stored(self) -> int:
        """New memories stored."""
        return sum(f.stored for f in self.files)


def claim_drop_files(db: Database, drop_dir: Path, *, min_age_seconds: float = 2.0, limit: int = 100) -> ClaimReport:
    """Claim up to ``limit`` ready files of the drop folder and its user folders."""
    report = ClaimReport()
    for path, user in list_ready_files_by_user(drop_dir, min_age_seconds=min_age_seconds)[:limit]:
        shown = path.name if user is None else f"{user}/{path.name}"
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
        try:
            result = finish_file(path, drop_dir, parsed, quarantine_suffix=suffix)
        except DropFolderError as exc:
            logger.warning("%s", exc)
            report.files.append(FileOutcome(shown, stored, duplicates, len(parsed.rejected), str(exc), None,
                                            kind, skipped))
            continue
        moved = result.path_processed or result.path_failed
        report.files.append(FileOutcome(shown, stored, duplicates, len(parsed.rejected), parsed.fatal,
                                        str(moved) if moved else None, kind, skipped))
        if outcome is not None:
            report.partitions |= outcome.partitions
    return report
