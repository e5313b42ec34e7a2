"""A user's (or everyone's) whole memory as a JSONL backup, and back into a database.

The backup is one JSON object per line: a header (``{"yak_backup": 1, …}``: who, when, the
schema and embedding it came from, the columns of each table), one ``{"table": …, "row": …}``
line per row, tables in :data:`~yak_pipeline.store.backup.BACKUP_TABLES` order (raw exchanges,
distillations, their versions, conflicts, turns, warmth events, API keys' metadata), and a
closing ``{"end": true, "counts": …}`` line, so a copy cut short is recognised. It never holds
a key or its hash (:mod:`yak_pipeline.store.backup`).

A restore reads the file twice: first to check it whole (header, every line, the closing
counts, the embedding size, and that the database holds none of its ids nor any of its
exchanges), then to write it in one transaction. Any refusal is one line and writes nothing.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Any, Final

import psycopg

from yak_pipeline.llm.errors import one_line
from yak_pipeline.store.audit import write_audit
from yak_pipeline.store.backup import (
    BACKUP_TABLES,
    KEYED_TABLES,
    REFERENCE_ONLY_TABLES,
    backup_columns,
    backup_rows,
    backup_size_estimate,
    backup_users,
    begin_snapshot,
    existing_exchanges,
    existing_ids,
    finish_restore,
    insert_backup_rows,
    insertable_columns,
    start_restore,
)
from yak_pipeline.store.database import Database
from yak_pipeline.store.memory_types import type_distillations
from yak_pipeline.store.migrations import migration_states, read_meta
from yak_pipeline.store.profile import rebuild_profile_lines

BACKUP_VERSION: Final = 1
_BATCH: Final = 500

# ``(rows done, rows in all)`` as a backup is written or restored.
Progress = Callable[[int, int], None]


class RestoreRefused(Exception):
    """Why a backup cannot be restored into this database, in one line; nothing was written."""


@dataclass
class BackupSummary:
    """What a backup holds (written or restored): rows per table, users, where it came from."""

    user_id: str | None
    counts: dict[str, int] = field(default_factory=dict)
    users: list[str] = field(default_factory=list)
    keys_not_restored: int = 0
    embedding_note: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON values (``--json``)."""
        return {"user_id": self.user_id, "counts": self.counts, "users": self.users,
                "keys_not_restored": self.keys_not_restored, "note": self.embedding_note}


def write_backup(db: Database, out: IO[str], *, user_id: str | None, on_progress: Progress | None = None) -> BackupSummary:
    """Write the backup of ``user_id`` (None: every user) to ``out``; one consistent snapshot."""
    summary = BackupSummary(user_id)
    with db.connection() as conn:
        # Every table read from the same snapshot: rows written meanwhile are all in or all out.
        begin_snapshot(conn)
        meta = read_meta(conn)
        applied = [s.migration.name for s in migration_states(conn) if s.applied_at is not None]
        columns = {table: backup_columns(conn, table) for table in BACKUP_TABLES}
        total = backup_size_estimate(conn, user_id)
        header = {"yak_backup": BACKUP_VERSION, "created_at": datetime.now(UTC).isoformat(),
                  "user_id": user_id, "schema": applied[-1] if applied else None,
                  "embedding": {"model": meta.get("embedding_model"), "dimensions": _int(meta.get("embedding_dim"))},
                  "tables": list(BACKUP_TABLES), "columns": columns}
        out.write(json.dumps(header) + "\n")
        done = 0
        for table in BACKUP_TABLES:
            count = 0
            for row in backup_rows(conn, table, columns[table], user_id=user_id):
                out.write(f'{{"table": "{table}", "row": {row}}}\n')
                count += 1
                done += 1
                if on_progress is not None and done % _BATCH == 0:
                    on_progress(done, total)
            summary.counts[table] = count
        summary.users = backup_users(conn, user_id)
    out.write(json.dumps({"end": True, "counts": summary.counts}) + "\n")
    if on_progress is not None:
        on_progress(done, done)
    return summary


def _int(value: str | None) -> int | None:
    return int(value) if value is not None else None


# --- restore -------------------------------------------------------------------------------------


@dataclass
class _Checked:
    header: dict[str, Any]
    counts: Counter = field(default_factory=Counter)
    ids: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    exchanges: tuple[list[str], list[str]] = field(default_factory=lambda: ([], []))
    users: set[str] = field(default_factory=set)


def restore_backup(db: Database, lines: Callable[[], Iterable[str]], *, name: str, actor: str = "cli",
                   on_progress: Progress | None = None) -> BackupSummary:
    """Restore the backup whose lines ``lines()`` yields (called twice: check, then write).

    Raises :class:`RestoreRefused` (one line, nothing written) when the file is not a whole Yak
    backup, or the database cannot take it: another embedding size, or ids or exchanges it
    already holds.
    """
    checked = _check_file(lines(), name)
    header = checked.header
    summary = BackupSummary(header.get("user_id"), counts={t: checked.counts[t] for t in BACKUP_TABLES},
                            users=sorted(checked.users), keys_not_restored=checked.counts["api_keys"])
    total = sum(checked.counts[t] for t in BACKUP_TABLES if t not in REFERENCE_ONLY_TABLES)
    try:
        with db.connection() as conn:
            columns = _restore_columns(conn, header)
            summary.embedding_note = _check_embedding(conn, header)
            _check_absent(conn, checked)
            start_restore(conn)
            done = 0
            for table, rows in _batches(lines(), columns):
                insert_backup_rows(conn, table, columns[table], rows)
                done += len(rows)
                if on_progress is not None:
                    on_progress(done, total)
            finish_restore(conn)
            # The profile is read from the exchanges again (a line dropped before the backup is back).
            for user in sorted(checked.users):
                rebuild_profile_lines(conn, user_id=user)
                # A backup made before memory types (sql/017) has none: typed as the migration types them.
                if "memory_type" not in columns["distillations"]:
                    type_distillations(conn, user_id=user)
            write_audit(conn, actor=actor, action="restore", target_type="backup", target_id=None,
                        user_id=header.get("user_id"), detail={"file": name, "counts": summary.counts})
    except psycopg.errors.UniqueViolation as exc:
        raise RestoreRefused(f"the database already holds rows of this backup ({one_line(exc, 200)}): "
                             "restore into a database without them") from None
    except (psycopg.errors.IntegrityError, psycopg.errors.DataError) as exc:
        raise RestoreRefused(f"{name}: a row of the backup does not fit this database ({one_line(exc, 200)}); "
                             "nothing was restored") from None
    return summary


def _check_file(lines: Iterable[str], name: str) -> _Checked:
    """Read the whole backup once: every line well-formed, the closing counts matching."""
    checked: _Checked | None = None
    ended = False
    number = 0
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            value = None
            if checked is not None:
                raise RestoreRefused(f"{name} line {number} is not JSON: the file is damaged") from None
        if checked is None:
            if not isinstance(value, dict) or value.get("yak_backup") != BACKUP_VERSION:
                raise RestoreRefused(f"{name} is not a Yak backup: its first line is not the header "
                                     "`yak export --format jsonl` writes")
            checked = _Checked(value)
            continue
        if ended:
            raise RestoreRefused(f"{name} line {number} comes after the closing line: the file is damaged")
        if isinstance(value, dict) and value.get("end") is True:
            ended = True
            if value.get("counts") != {t: checked.counts[t] for t in BACKUP_TABLES}:
                raise RestoreRefused(f"{name}: the closing line's counts differ from the rows in the file")
            continue
        table, row = (value.get("table"), value.get("row")) if isinstance(value, dict) else (None, None)
        if table not in BACKUP_TABLES or not isinstance(row, dict):
            raise RestoreRefused(f"{name} line {number} is not a row of a Yak backup")
        checked.counts[table] += 1
        if table in KEYED_TABLES:
            checked.ids[table].append(str(row.get("id")))
        if table == "memories":
            checked.exchanges[0].append(str(row.get("user_id")))
            checked.exchanges[1].append(str(row.get("content_sha256")))
            checked.users.add(str(row.get("user_id")))
    if checked is None:
        raise RestoreRefused(f"{name} is empty")
    if not ended:
        raise RestoreRefused(f"{name} is incomplete: it ends at line {number} without the closing line "
                             "(a copy cut short?); nothing was restored")
    return checked


def _restore_columns(conn: psycopg.Connection, header: dict[str, Any]) -> dict[str, list[str]]:
    """Per table, the backup's columns this database takes; a column it does not know is a refusal."""
    declared = header.get("columns") or {}
    columns: dict[str, list[str]] = {}
    for table in BACKUP_TABLES:
        if table in REFERENCE_ONLY_TABLES:
            continue
        known = insertable_columns(conn, table)
        mine = [c for c in declared.get(table, []) if isinstance(c, str)]
        unknown = [c for c in mine if c not in known and c not in backup_columns(conn, table)]
        if unknown:
            raise RestoreRefused(f"the backup's {table} have column {unknown[0]}, which this Yak does not know "
                                 f"(backup schema {header.get('schema')}): restore with that Yak version or newer")
        columns[table] = [c for c in mine if c in known]
    return columns


def _check_embedding(conn: psycopg.Connection, header: dict[str, Any]) -> str | None:
    """Refuse vectors of another size; note vectors of another model (recall then needs a re-embed)."""
    meta = read_meta(conn)
    theirs = header.get("embedding") or {}
    mine_dim = _int(meta.get("embedding_dim"))
    if theirs.get("dimensions") is not None and mine_dim is not None and theirs["dimensions"] != mine_dim:
        raise RestoreRefused(f"the backup's vectors have {theirs['dimensions']} dimensions and this database "
                             f"{mine_dim}: restore into a database made with the backup's embedder "
                             f"({theirs.get('model')})")
    if theirs.get("model") and meta.get("embedding_model") and theirs["model"] != meta["embedding_model"]:
        return (f"the backup's vectors are from {theirs['model']}, this Yak embeds with {meta['embedding_model']}: "
                "run `yak distill re-embed` before recalling")
    return None


def _check_absent(conn: psycopg.Connection, checked: _Checked) -> None:
    """One line if the database holds any of the backup's ids, or any of its exchanges under another id."""
    for table in KEYED_TABLES:
        ids = checked.ids.get(table, [])
        for start in range(0, len(ids), 10_000):
            found = existing_ids(conn, table, ids[start:start + 10_000])
            if found:
                raise RestoreRefused(f"the database already holds {table} of this backup (id {found[0]}): "
                                     "restore needs a database without them")
    users, digests = checked.exchanges
    for start in range(0, len(users), 10_000):
        holders = existing_exchanges(conn, users[start:start + 10_000], digests[start:start + 10_000])
        if holders:
            raise RestoreRefused(f"the database already holds exchanges of this backup for user {holders[0]}: "
                                 "restore needs a database without them")


def _batches(lines: Iterable[str], columns: dict[str, list[str]]) -> Iterator[tuple[str, list[str]]]:
    """The backup's rows as ``(table, [row JSON, …])`` batches, in file order."""
    table: str | None = None
    rows: list[str] = []
    for number, line in enumerate(lines):
        if number == 0 or not line.strip():
            continue
        value = json.loads(line)
        if value.get("end") is True or value["table"] not in columns:
            continue
        if value["table"] != table or len(rows) >= _BATCH:
            if rows and table is not None:
                yield table, rows
            table, rows = value["table"], []
        rows.append(json.dumps(value["row"]))
    if rows and table is not None:
        yield table, rows
