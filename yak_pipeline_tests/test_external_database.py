"""An external PostgreSQL (docs/SCALING.md): the store tests pass against a server Yak did not start.

The server (``external_postgres``) is started the way an operator would run one: its own data
directory, listening on a TCP port of 127.0.0.1 (not a Unix socket), password authentication
(scram-sha-256) for a role that is not the superuser Yak's embedded server uses, pgvector created
by the administrator in ``template1``, which every database the tests create copies. The store
tests then run in a separate pytest process with ``YAK_TEST_DATABASE_URL``
pointing at it, so nothing of this session's embedded server is involved.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from yak_pipeline_tests.external_postgres import external_postgres

pytestmark = pytest.mark.slow
PROJECT_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def external_server() -> Iterator[str]:
    """A PostgreSQL 18 on 127.0.0.1:<port> with password auth and a non-superuser owner role."""
    with external_postgres() as server:
        yield server.url


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
