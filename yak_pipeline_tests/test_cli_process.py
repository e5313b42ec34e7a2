"""`yak process` and `yak db` end to end, as a user runs them: real subprocesses, real database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from yak_pipeline.store.database import connect
from yak_pipeline_tests.store_helpers import seed_memory_with_distillation

USERS = {"alice": ["I live in Lisbon with my husband Marco.", "I work as a nurse at the Santa Maria hospital.",
                   "I love hiking in Sintra on weekends.", "My sister Ana is visiting next week.",
                   "I prefer tea over coffee in the morning.", "I'm allergic to peanuts.",
                   "My daughter Sofia turned five yesterday.", "I usually run 5 km every morning.",
                   "I think I might start learning the piano.", "The weather was strange today."],
         "bob": ["I'm a software engineer in Berlin.", "I hate loud restaurants.", "My brother Tom lives in Munich.",
                 "I enjoy cooking Thai food.", "I was born in Hamburg.", "I always cycle to work.",
                 "My favourite band is Radiohead.", "I have two cats named Miso and Nori.",
                 "Maybe I'll go to Japan next year.", "What's a good movie tonight?"]}


def _yak(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yak_pipeline.cli.main", *args], env=env, capture_output=True,
                          text=True, timeout=300)


def _env(db_url: str, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("YAK_")}
    env.update(YAK_DATABASE_URL=db_url, YAK_EMBEDDER="hashing", YAK_HOME=str(tmp_path / "home"),
               YAK_DROP_DIR=str(tmp_path / "drop"))
    return env


def test_process_distils_two_users_and_quarantines_a_malformed_file(db_url: str, tmp_path: Path) -> None:
    drop = tmp_path / "drop"
    drop.mkdir()
    lines = [json.dumps({"user_id": user, "user": text, "assistant": "Noted.",
                         "occurred_at": f"2026-11-{18 + i % 2}T10:{i:02d}:00Z"})
             for user, texts in USERS.items() for i, text in enumerate(texts)]
    (drop / "history.jsonl").write_text("\n".join(lines) + "\n")
    (drop / "broken.json").write_text('{"user_id": "alice", "user": "unterminated')

    result = _yak(["process", "--json"], _env(db_url, tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["assets"]["distillations"]["rows_out"] == 20
    assert report["assets"]["raw_exchanges"]["rows_in"] == 20
    # Each exchange's distillation, its own text and its context were embedded (merges may add more).
    assert report["documents_embedded"] >= 3 * 20
    # One run per user over both of their days, not one per day.
    assert sorted((p["user"], p["success"], p["date"], p["last_date"], p["days_with_work"])
                  for p in report["partitions"]) == [("alice", True, "2026-11-18", "2026-11-19", 2),
                                                     ("bob", True, "2026-11-18", "2026-11-19", 2)]

    with connect(db_url) as conn:
        per_user = dict(conn.execute("SELECT user_id, count(*) FROM distillations GROUP BY 1").fetchall())
        mixed = conn.execute("""SELECT count(*) FROM distillations d JOIN memories m ON m.id = d.memory_id
                                WHERE d.user_id <> m.user_id""").fetchone()[0]
        pending = conn.execute("SELECT count(*) FROM memories WHERE status <> 'distilled'").fetchone()[0]
        # Hybrid recall searches the raw exchanges by meaning too: each got its vector with its distillation.
        unembedded = conn.execute(
            "SELECT count(*) FROM memories WHERE embedding IS NULL OR embedding_model <> 'feature-hashing-384'"
        ).fetchone()[0]
        lisbon_owner = conn.execute("SELECT user_id FROM distillations WHERE content ILIKE '%lisbon%'").fetchall()
    assert per_user == {"alice": 10, "bob": 10}
    assert mixed == 0 and pending == 0 and unembedded == 0
    assert lisbon_owner == [("alice",)]
    assert (drop / "processed" / "history.jsonl").exists()
    assert (drop / "failed" / "broken.json").exists()
    error = (drop / "failed" / "broken.json.error.txt").read_text()
    assert "line 1" in error and "JSON" in error

    again = _yak(["process", "--json"], _env(db_url, tmp_path))
    assert again.returncode == 0 and json.loads(again.stdout)["partitions"] == []
    assert json.loads(again.stdout)["documents_embedded"] == 0


def test_process_rejects_a_bad_date_in_one_line(db_url: str, tmp_path: Path) -> None:
    result = _yak(["process", "--date", "yesterday"], _env(db_url, tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error:") and "Traceback" not in result.stderr


def test_process_with_nothing_to_do_says_so_without_an_empty_table(db_url: str, tmp_path: Path) -> None:
    result = _yak(["process"], _env(db_url, tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == "nothing to do\n"


def test_db_migrate_twice_and_status_lists_every_table(pg_server_url: str, tmp_path: Path) -> None:
    from yak_pipeline_tests.conftest import create_database, drop_database

    name = f"yak_cli_{os.getpid()}"
    url = create_database(pg_server_url, name)
    try:
        env = _env(url, tmp_path)
        first, second = _yak(["db", "migrate", "--json"], env), _yak(["db", "migrate", "--json"], env)
        assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
        assert json.loads(first.stdout)["applied"][0] == "001_schema"
        assert json.loads(second.stdout)["applied"] == []
        status = _yak(["db", "status", "--json"], env)
        tables = json.loads(status.stdout)["tables"]
        assert set(tables) >= {"memories", "distillations", "distillation_versions", "conflicts", "turns",
                               "warmth_events", "audit_log"}
        assert all(count == 0 for count in tables.values())
        assert all(m["applied_at"] for m in json.loads(status.stdout)["migrations"])
        # Another embedder size against this database: one line, exit 2, nothing changed.
        mismatch = _yak(["db", "migrate"], {**env, "YAK_EMBED_DIMENSIONS": "256"})
        assert mismatch.returncode == 2 and "384" in mismatch.stderr and "Traceback" not in mismatch.stderr
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT value FROM yak_meta WHERE key = 'embedding_dim'").fetchone()[0] == "384"
    finally:
        drop_database(pg_server_url, name)


def test_a_range_whose_quality_check_fails_runs_again_day_by_day(db_url: str, tmp_path: Path) -> None:
    drop = tmp_path / "drop"
    drop.mkdir()
    lines = [json.dumps({"user_id": "alice", "user": text, "assistant": "Noted.",
                         "occurred_at": f"2026-11-{18 + i % 2}T10:{i:02d}:00Z"})
             for i, text in enumerate(USERS["alice"][:4])]
    (drop / "history.jsonl").write_text("\n".join(lines) + "\n")
    with connect(db_url) as conn:  # a row only the quality gate catches, on the 18th
        _, bad = seed_memory_with_distillation(conn, user_id="alice", exchange="User: hi\nAssistant: hello",
                                               distillation="User said hi.",
                                               occurred_at=datetime(2026, 11, 18, 9, tzinfo=UTC))
        conn.execute("UPDATE distillations SET content = 'One. Two. Three. Four. Five. Six.', prompt_version = 'v1' "
                     "WHERE id = %s", (bad,))

    result = _yak(["process", "--json"], _env(db_url, tmp_path))
    report = json.loads(result.stdout)
    assert result.returncode == 1  # a failed day fails the command
    assert sorted((p["date"], p["last_date"], p["success"], p["failed_checks"]) for p in report["partitions"]) == [
        ("2026-11-18", "2026-11-18", False, ["distillation_quality"]), ("2026-11-19", "2026-11-19", True, [])]
    # Counted once: the range's own figures, then the downstream steps of the day that passed.
    assert report["assets"]["raw_exchanges"]["rows_in"] == 5 and report["assets"]["distillations"]["rows_out"] == 4
    with connect(db_url) as conn:
        checked = dict(conn.execute(
            """SELECT (m.occurred_at AT TIME ZONE 'UTC')::date::text, bool_and(d.conflict_checked_at IS NOT NULL)
               FROM distillations d JOIN memories m ON m.id = d.memory_id GROUP BY 1""").fetchall())
    assert checked == {"2026-11-18": False, "2026-11-19": True}  # the failing day is held back
