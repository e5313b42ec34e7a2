"""Claim drop-folder files: parse, store their exchanges, then move them out of the folder.

Shared by the drop-folder sensor and ``yak process``. Storing happens before the file moves,
and storing is idempotent on the content hash, so a crash between the two re-ingests the file
as duplicates on the next tick: nothing is lost, nothing is stored twice.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from yak_pipeline.defs.exchanges.drop_folder import DropFolderError, finish_file, list_ready_files, read_and_parse
from yak_pipeline.services.ingest import ingest_records
from yak_pipeline.store.database import Database

logger = logging.getLogger(__name__)


@dataclass
class FileOutcome:
    """What became of one file."""

    name: str
    stored: int
    duplicates: int
    rejected: int
    error: str | None
    moved_to: str | None


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
    """Claim up to ``limit`` ready files of the drop folder."""
    report = ClaimReport()
    for path in list_ready_files(drop_dir, min_age_seconds=min_age_seconds)[:limit]:
        parsed = read_and_parse(path)
        ingested = ingest_records(db, parsed.records, source="drop_folder", source_ref=path.name)
        # Records the database refused are quarantined with the parser's rejects.
        parsed = dataclasses.replace(parsed, rejected=parsed.rejected + tuple(ingested.rejected))
        try:
            result = finish_file(path, drop_dir, parsed)
        except DropFolderError as exc:
            logger.warning("%s", exc)
            report.files.append(FileOutcome(path.name, len(ingested.stored), len(ingested.duplicates),
                                            len(parsed.rejected), str(exc), None))
            continue
        moved = result.path_processed or result.path_failed
        report.files.append(FileOutcome(path.name, len(ingested.stored), len(ingested.duplicates),
                                        len(parsed.rejected), parsed.fatal, str(moved) if moved else None))
        report.partitions |= ingested.partitions
    return report
