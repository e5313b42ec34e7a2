"""Real services for the tests: an embedded PostgreSQL with pgvector and a loopback OpenAI server.

The PostgreSQL server is started once per session (or taken from ``YAK_TEST_DATABASE_URL``);
the schema is migrated once into a template database, and each test that needs a database
gets a fresh copy of it (``CREATE DATABASE … TEMPLATE``), so tests never see each other's rows.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from yak_pipeline.settings import Settings, get_settings
from yak_pipeline.store.database import Database, connect, with_database

pytest_plugins = ["yak_pipeline_tests.loopback_fixtures"]

# Tests use the hashing embedder: deterministic, instant, and the same 384 dimensions as the
# local model. Tests that exercise the local model say so explicitly.
TEST_EMBED_DIMENSIONS = 384
PROJECT_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No test reads the developer's YAK_* variables or writes into the project's .yak folder."""
    for name in list(os.environ):
        if name.startswith("YAK_") and name != "YAK_TEST_DATABASE_URL":
            monkeypatch.delenv(name)
    monkeypatch.setenv("YAK_HOME", str(tmp_path / "yak-home"))
    # `yak` subprocesses run the code under test, not whichever checkout the venv's console script
    # was installed from (worktrees can share one venv).
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p))
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture(scope="session")
def pg_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of the test PostgreSQL server (maintenance database); stopped and removed afterwards."""
    external = os.environ.get("YAK_TEST_DATABASE_URL")
    if external:
        yield external
        return
    from yak_pipeline.store.embedded import start_embedded_server, stop_embedded_server

    # A short path: the server's Unix socket lives in this folder and socket paths are limited.
    pgdata = Path(f"/tmp/yak-test-pg-{os.getpid()}")
    yield start_embedded_server(pgdata, keep_running=False)
    # Stopped here, not only at exit: a pytest-xdist worker ends without running exit handlers,
    # and every `make test` left its workers' servers running with their data (a few dozen
    # postmasters and their folders in /tmp after a day's work).
    stop_embedded_server(pgdata)
    shutil.rmtree(pgdata, ignore_errors=True)


def create_database(server_url: str, name: str, template: str | None = None) -> str:
    """Create database ``name`` (optionally from a template) and return its URL."""
    with connect(server_url, autocommit=True, vector=False) as conn:
        suffix = f" TEMPLATE {template}" if template else ""
        conn.execute(f'CREATE DATABASE "{name}"{suffix}')
    return with_database(server_url, name)


def drop_database(server_url: str, name: str) -> None:
    """Drop database ``name``, disconnecting anyone still on it."""
    with connect(server_url, autocommit=True, vector=False) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def template_database(pg_server_url: str) -> Iterator[str]:
    """Name of a database migrated with the test embedder's dimension, copied per test."""
    from yak_pipeline.store.migrations import migrate

    name = f"yak_template_{uuid.uuid4().hex[:8]}"
    url = create_database(pg_server_url, name)
    migrate(url, dimensions=TEST_EMBED_DIMENSIONS, model_name=f"feature-hashing-{TEST_EMBED_DIMENSIONS}")
    yield name
    drop_database(pg_server_url, name)


@pytest.fixture
def db_url(pg_server_url: str, template_database: str) -> Iterator[str]:
    """URL of a fresh, migrated database for this test alone."""
    name = f"yak_test_{uuid.uuid4().hex[:12]}"
    url = create_database(pg_server_url, name, template=template_database)
    yield url
    drop_database(pg_server_url, name)


@pytest.fixture
def settings(db_url: str, tmp_path: Path) -> Settings:
    """Settings for a test: its own database and home, hashing embedder, rules LLM."""
    return Settings(home=tmp_path / "yak-home", database_url=db_url, embedder="hashing")


@pytest.fixture
def database(db_url: str) -> Iterator[Database]:
    """An open connection pool on the test's database."""
    db = Database(db_url, max_size=4).open()
    yield db
    db.close()


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection]:
    """One connection on the test's database (committed by the test when it needs to)."""
    with connect(db_url) as connection:
        yield connection


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`make test-slow` runs on two workers (``-n 2 --dist loadgroup``): the 10 MB drop-file test,
    minutes of storing, in its own group on one, and every other slow test in one group, so they
    still run one at a time on the other (the load and crash tests start servers and workers of
    their own)."""
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group("slow-one-at-a-time"))
