"""What needs doing: the discovery the sensors and ``yak process`` share."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from yak_pipeline.ingestion.claim import ClaimReport, claim_drop_files
from yak_pipeline.store.database import Database
from yak_pipeline.store.memories import pending_memory_partitions
from yak_pipeline.store.turns import pending_turn_partitions


@dataclass
class Discovery:
    """Partitions with work: (user, day) → (pending count, signature of the pending state)."""

    claimed: ClaimReport = field(default_factory=ClaimReport)
    memory_partitions: dict[tuple[str, date], tuple[int, str]] = field(default_factory=dict)
    turn_partitions: dict[tuple[str, date], tuple[int, str]] = field(default_factory=dict)

    @property
    def users(self) -> set[str]:
        """Every user with work."""
        return {u for u, _ in self.memory_partitions} | {u for u, _ in self.turn_partitions}


def discover_work(db: Database, *, drop_dir: Path | None, user_id: str | None = None, day: date | None = None,
                  min_age_seconds: float = 2.0, drop_folder: bool | None = None) -> Discovery:
    """Claim ready drop files, then list the partitions with pending memories and pending turns.

    ``drop_folder`` narrows the pending memories to those from (True) or not from (False) the
    drop folder, so the drop-folder and inbox sensors each request their own runs.
    """
    found = Discovery()
    if drop_dir is not None:
        found.claimed = claim_drop_files(db, drop_dir, min_age_seconds=min_age_seconds)
    with db.connection() as conn:
        memories = pending_memory_partitions(conn, drop_folder=drop_folder)
        turns = pending_turn_partitions(conn)
    keep = lambda u, d: (user_id is None or u == user_id) and (day is None or d == day)  # noqa: E731
    found.memory_partitions = {(u, d): (n, sig) for u, d, n, sig in memories if keep(u, d)}
    found.turn_partitions = {(u, d): (n, sig) for u, d, n, sig in turns if keep(u, d)}
    return found
