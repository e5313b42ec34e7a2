"""What needs doing: the discovery the sensors and ``yak process`` share."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from yak_pipeline.ingestion.claim import ClaimReport, claim_drop_files, plan_drop_files
from yak_pipeline.store.database import Database
from yak_pipeline.store.memories import pending_memory_partitions
from yak_pipeline.store.turns import pending_turn_partitions


@dataclass
class Discovery:
    """Users' days with work: (user, UTC day) → (pending count, signature of the pending state).

    ``drop_files`` names, for each partition, the ready drop-folder files holding its exchanges:
    that partition's run stores them (the ``raw_exchanges`` asset). ``claimed`` are the files
    finished at once because they hold nothing to store (unreadable, or every record refused).
    """

    claimed: ClaimReport = field(default_factory=ClaimReport)
    drop_files: dict[tuple[str, date], list[str]] = field(default_factory=dict)
    memory_partitions: dict[tuple[str, date], tuple[int, str]] = field(default_factory=dict)
    turn_partitions: dict[tuple[str, date], tuple[int, str]] = field(default_factory=dict)

    @property
    def users(self) -> set[str]:
        """Every user with work."""
        return {u for u, _ in self.memory_partitions} | {u for u, _ in self.turn_partitions}


def discover_work(db: Database, *, drop_dir: Path | None, user_id: str | None = None, day: date | None = None,
                  min_age_seconds: float = 2.0, drop_folder: bool | None = None) -> Discovery:
    """Find the ready drop files and what they hold, then the partitions with pending memories and turns.

    Nothing is stored here: a partition with ready drop files is listed (its signature covers
    the files, so a changed or new file asks for a new run) for its run to store them. Only
    files holding nothing to store are finished here, since no run would ever claim them.
    ``drop_folder`` narrows the pending memories to those from (True) or not from (False) the
    drop folder, so the drop-folder and inbox sensors each request their own runs.
    """
    found = Discovery()
    keep = lambda u, d: (user_id is None or u == user_id) and (day is None or d == day)  # noqa: E731
    file_signatures: dict[tuple[str, date], str] = {}
    if drop_dir is not None:
        plan = plan_drop_files(db, drop_dir, min_age_seconds=min_age_seconds)
        if plan.nothing_to_store:
            found.claimed = claim_drop_files(db, drop_dir, names=plan.nothing_to_store)
        for key, files in plan.files_by_partition().items():
            if keep(*key):
                found.drop_files[key] = [f.name for f in files]
                joined = "\0".join(f"{f.name}\0{f.signature}" for f in files)
                file_signatures[key] = "files-" + hashlib.sha256(joined.encode()).hexdigest()[:12]
    with db.connection() as conn:
        memories = pending_memory_partitions(conn, drop_folder=drop_folder)
        turns = pending_turn_partitions(conn)
    found.memory_partitions = {(u, d): (n, sig) for u, d, n, sig in memories if keep(u, d)}
    for key, signature in file_signatures.items():
        count, pending = found.memory_partitions.get(key, (0, None))
        found.memory_partitions[key] = (count, signature if pending is None else f"{pending}-{signature}")
    found.turn_partitions = {(u, d): (n, sig) for u, d, n, sig in turns if keep(u, d)}
    return found
