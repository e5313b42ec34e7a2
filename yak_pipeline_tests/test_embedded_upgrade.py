"""`yak db upgrade`: an earlier Yak's embedded PostgreSQL 16 directory, populated by `yak process`
through that very server, is refused with one line and then carried over to PostgreSQL 18 with
every row — as a user upgrading Yak would meet it. Real servers on both sides, real subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from yak_pipeline.store.database import ensure_dagster_database
from yak_pipeline.store.embedded import EMBEDDED_MAJOR, data_major_version, stop_embedded_server
from yak_pipeline_tests.test_cli_process import USERS


def _yak(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yak_pipeline.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture
def old_home() -> Path:
    """A YAK_HOME whose pgdata is PostgreSQL 16 (pgserver 0.1.4, what Yak embedded before), stopped.

    In /tmp with a short name: the server's socket lives in its data folder, and socket paths
    are limited to about 100 characters.
    """
    import pgserver

    home = Path(f"/tmp/yu-{uuid.uuid4().hex[:8]}")
    home.mkdir()
    server = pgserver.get_server(home / "pgdata", cleanup_mode=None)
    ensure_dagster_database(server.get_uri())  # Dagster's runs live in a second database
    yield home, server.get_uri()
    for folder in [home / "pgdata", *home.glob("pgdata.*")]:
        stop_embedded_server(folder)
    shutil.rmtree(home, ignore_errors=True)


def _env(home: Path, database_url: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("YAK_")}
    env.update(YAK_EMBEDDER="hashing", YAK_HOME=str(home), YAK_DROP_DIR=str(home / "drop"))
    if database_url:
        env["YAK_DATABASE_URL"] = database_url
    return env


def _counts(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        return {table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # noqa: S608 - fixed names
                for table in ("memories", "distillations", "distillation_versions", "audit_log")}


def test_an_old_data_directory_is_refused_then_upgraded_with_every_row(old_home: tuple[Path, str]) -> None:
    home, old_url = old_home
    # Populate it the way an earlier Yak did: `yak process` through that server.
    (home / "drop").mkdir()
    lines = [json.dumps({"user_id": user, "user": text, "assistant": "Noted.",
                         "occurred_at": f"2026-11-{18 + i % 2}T10:{i:02d}:00Z"})
             for user, texts in USERS.items() for i, text in enumerate(texts)]
    (home / "drop" / "history.jsonl").write_text("\n".join(lines) + "\n")
    processed = _yak(["process", "--json"], _env(home, old_url))
    assert processed.returncode == 0, processed.stderr[-2000:]
    before = _counts(old_url)
    assert before["distillations"] == 20
    with psycopg.connect(old_url) as conn:
        vectors = dict(conn.execute("SELECT id, embedding::text FROM distillations").fetchall())
    stop_embedded_server(home / "pgdata")
    assert data_major_version(home / "pgdata") == 16

    refused = _yak(["memory", "search", "Lisbon", "--user", "alice"], _env(home))
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "yak db upgrade" in refused.stderr, refused.stderr
    assert data_major_version(home / "pgdata") == 16  # untouched

    upgraded = _yak(["db", "upgrade", "--json"], _env(home))
    assert upgraded.returncode == 0, upgraded.stderr[-2000:]
    report = json.loads(upgraded.stdout)
    assert report["from_postgresql"] == 16 and report["to_postgresql"] == EMBEDDED_MAJOR
    assert {"postgres", "dagster"} <= set(report["databases"])
    assert "copying database postgres" in upgraded.stderr  # progress, on stderr
    kept = Path(report["old_data_kept_at"])
    assert data_major_version(kept) == 16 and data_major_version(home / "pgdata") == EMBEDDED_MAJOR

    status = _yak(["db", "status", "--json"], _env(home))
    assert status.returncode == 0, status.stderr[-2000:]
    state = json.loads(status.stdout)
    assert state["postgresql"].startswith(f"{EMBEDDED_MAJOR}.") and state["pgvector"].startswith("0.8.")
    assert all(m["applied_at"] for m in state["migrations"])
    new_url = _yak(["db", "url", "--show-password"], _env(home)).stdout.strip()
    assert _counts(new_url) == before
    with psycopg.connect(new_url) as conn:
        assert dict(conn.execute("SELECT id, embedding::text FROM distillations").fetchall()) == vectors

    found = _yak(["memory", "search", "Lisbon husband Marco", "--user", "alice", "--threshold", "0", "--json"],
                 _env(home))
    assert found.returncode == 0, found.stderr[-2000:]
    assert any("Lisbon" in hit["content"] for hit in json.loads(found.stdout))

    again = _yak(["db", "upgrade"], _env(home))
    assert again.returncode == 2 and "already PostgreSQL" in again.stderr
