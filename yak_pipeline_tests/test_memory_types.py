"""Memory types (issue 39, item 1) end to end, on the real PostgreSQL: an upgraded database typed by
sql/017, the distiller's type and an event's day stored, shown and changed through the API and the
CLI (audited before and after), recall hits carrying them, MEMORY.md grouping by them.
"""

from __future__ import annotations

import json
import shutil
import uuid
from datetime import UTC, date, datetime
from pathlib import Path

import psycopg
import pytest

from yak_loopback.openai_replies import Reply
from yak_loopback.openai_server import FakeOpenAIServer
from yak_pipeline.embeddings.hashing import HashingEmbedder
from yak_pipeline.llm.rules import RulesProvider
from yak_pipeline.services.distill import DistillJob, distill_memories
from yak_pipeline.store.database import Database, connect
from yak_pipeline.store.memories import insert_memory, new_exchange
from yak_pipeline.store.migrations import SQL_DIR, migrate
from yak_pipeline_tests.api_fixtures import ADMIN_KEY, Seeded, api_settings, app, client_with, seeded  # noqa: F401
from yak_pipeline_tests.conftest import create_database, drop_database
from yak_pipeline_tests.loopback_fixtures import openai_server  # noqa: F401
from yak_pipeline_tests.test_cli_inprocess import run  # noqa: F401 - the in-process `yak` fixture
from yak_pipeline_tests.test_llm_openai_client import make_provider

FRIDAY = datetime(2026, 11, 27, 15, 0, tzinfo=UTC)
EXCHANGES = {
    "instruction": "User: Always answer me in French.\nAssistant: D'accord.",
    "preference": "User: I'd rather take trains everywhere.\nAssistant: Noted.",
    "event": "User: I finished the migration last Tuesday.\nAssistant: Well done!",
    "fact": "User: I live in Lyon.\nAssistant: Nice city.",
}


def _audit(conn: psycopg.Connection, target: object) -> list[tuple]:
    return conn.execute("SELECT actor, detail FROM audit_log WHERE action = 'type' AND target_id = %s ORDER BY id",
                        (str(target),)).fetchall()


def test_an_upgraded_database_is_typed_by_the_offline_classifier(pg_server_url: str, tmp_path: Path) -> None:
    """sql/017 on a database that already holds distillations: each is typed from its exchange."""
    before = tmp_path / "sql"
    before.mkdir()
    for path in SQL_DIR.iterdir():
        if path.name.endswith(".sql") and int(path.name[:3]) < 17:
            shutil.copy(str(path), before / path.name)
    name = f"yak_types_{uuid.uuid4().hex[:10]}"
    url = create_database(pg_server_url, name)
    try:
        migrate(url, dimensions=384, model_name="m", sql_dir=before)
        with connect(url) as conn:
            ids = {}
            for kind, exchange in EXCHANGES.items():
                memory = insert_memory(conn, new_exchange(user_id="ana", content=exchange, source="import", occurred_at=FRIDAY))
                ids[kind] = conn.execute(
                    """INSERT INTO distillations (memory_id, user_id, content, confidence, tier, status,
                                                  prompt_version, refreshed_at)
                       VALUES (%s, 'ana', %s, 0.9, 'medium', 'review', 'v1', %s) RETURNING id""",
                    (memory.id, f"User said something ({kind}).", FRIDAY)).fetchone()[0]
            conn.commit()
        # 017 and the migrations after it (the upgrade from 016 runs them all).
        assert [m.name for m in migrate(url, dimensions=384, model_name="m")][0] == "017_memory_types"
        with connect(url) as conn:
            typed = {kind: conn.execute("SELECT memory_type, event_on FROM distillations WHERE id = %s",
                                        (ids[kind],)).fetchone() for kind in EXCHANGES}
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute("UPDATE distillations SET memory_type = 'opinion'")
            conn.rollback()
            with pytest.raises(psycopg.errors.CheckViolation):  # only an event has a day
                conn.execute("UPDATE distillations SET event_on = '2026-01-01' WHERE id = %s", (ids["fact"],))
    finally:
        drop_database(pg_server_url, name)
    assert typed == {"instruction": ("instruction", None), "preference": ("preference", None),
                     "event": ("event", date(2026, 11, 24)), "fact": ("fact", None)}


def test_the_rules_distiller_types_each_memory_and_dates_an_event(database: Database) -> None:
    with database.connection() as conn:
        ids = {kind: str(insert_memory(conn, new_exchange(user_id="ana", content=exchange, source="api", occurred_at=FRIDAY)).id)
               for kind, exchange in EXCHANGES.items()}
    job = DistillJob(database, llm=RulesProvider(), embedder=HashingEmbedder(384), prompt_version="v1")
    assert distill_memories(job, list(ids.values())).rows_out == 4
    with database.connection() as conn:
        typed = dict(conn.execute("SELECT memory_id::text, (memory_type, event_on)::text FROM distillations "
                                  "WHERE user_id = 'ana'").fetchall())
    assert typed == {ids["instruction"]: "(instruction,)", ids["preference"]: "(preference,)",
                     ids["event"]: "(event,2026-11-24)", ids["fact"]: "(fact,)"}


def test_an_llms_type_is_stored_and_an_event_dated_from_the_users_words(
        database: Database, openai_server: FakeOpenAIServer) -> None:  # noqa: F811
    openai_server.script(
        Reply.json({"content": "User's exam is on 3 May.", "confidence": 0.9, "tier": "medium", "type": "Event"}),
        Reply.json({"content": "User likes Lyon.", "confidence": 0.9, "tier": "medium", "type": "preference"}))
    with database.connection() as conn:
        exam = insert_memory(conn, new_exchange(user_id="ana", content="User: My exam is on 3 May!\nAssistant: Good luck.",
                                                source="api", occurred_at=FRIDAY)).id
        lyon = insert_memory(conn, new_exchange(user_id="ana", content="User: Lyon is lovely in May 5 ways.\nAssistant: Yes.",
                                                source="api", occurred_at=FRIDAY)).id
    job = DistillJob(database, llm=make_provider(openai_server), embedder=HashingEmbedder(384), prompt_version="v1")
    assert distill_memories(job, [str(exam), str(lyon)], concurrency=1).rows_out == 2
    with database.connection() as conn:
        rows = dict(conn.execute("SELECT memory_id, (memory_type, event_on, schema_version)::text FROM distillations"
                                 ).fetchall())
    # The nearest 3 May to 27 Nov 2026 is next year's; a preference has no day whatever its words say.
    assert rows == {exam: "(event,2027-05-03,2)", lyon: "(preference,,2)"}


def test_the_api_shows_and_changes_the_type_audited_and_scoped(app, seeded: Seeded,  # noqa: ANN001, F811
                                                               database: Database) -> None:
    target = seeded.alice.distillation_id  # "My locker code is …": a fact
    with client_with(app, seeded.alice_key) as alice:
        shown = alice.get(f"/api/distillations/{target}").json()
        assert (shown["memory_type"], shown["event_on"]) == ("fact", None)
        changed = alice.post(f"/api/distillations/{target}/type", json={"memory_type": "instruction"})
        assert changed.status_code == 200 and changed.json()["memory_type"] == "instruction"
        bad = alice.post(f"/api/distillations/{target}/type", json={"memory_type": "opinion"})
        assert bad.status_code == 422 and "memory_type" in json.dumps(bad.json())
        assert alice.post(f"/api/distillations/{seeded.bob.distillation_id}/type",
                          json={"memory_type": "event"}).status_code == 404  # not alice's
        listed = alice.get("/api/distillations", params={"user_id": "alice"}).json()["items"]
        assert {d["id"]: d["memory_type"] for d in listed}[target] == "instruction"
        memory = alice.get(f"/api/memories/{seeded.alice.memory_id}").json()
        assert memory["distillations"][0]["memory_type"] == "instruction"
        hits = alice.post("/api/distillations/search", json={"user_id": "alice", "query": "What is my locker code?",
                                                               "threshold": 0.1}).json()
        assert {h["id"]: h["memory_type"] for h in hits if h["kind"] == "distilled"}[target] == "instruction"
        assert all(h["memory_type"] is None for h in hits if h["kind"] == "raw")
        assert "## Instructions — how the user wants to be answered" in alice.get("/api/export/memory.md").text
    with database.connection() as conn:
        assert [d for _, d in _audit(conn, target)] == [
            {"before": "fact", "after": "instruction", "event_on_before": None, "event_on_after": None}]
        bob = conn.execute("SELECT memory_type FROM distillations WHERE id = %s", (seeded.bob.distillation_id,))
        assert bob.fetchone() == ("fact",)


def test_the_cli_sets_the_type_with_one_line_errors(run, seeded: Seeded, database: Database) -> None:  # noqa: ANN001, F811
    target = seeded.alice.distillation_id
    done = run("distill", "type", target, "preference")
    assert done.exit_code == 0 and done.stdout.strip() == f"{target} type preference", done.stdout
    as_json = run("distill", "type", target, "fact", "--json")
    assert as_json.exit_code == 0 and json.loads(as_json.stdout)["memory_type"] == "fact"
    bad = run("distill", "type", target, "opinion")
    assert bad.exit_code == 1 and bad.stderr.startswith("error: ") and bad.stderr.count("\n") == 1, bad.stderr
    assert "Traceback" not in bad.stderr + bad.stdout
    shown = run("distill", "show", target)
    assert shown.exit_code == 0 and "type fact" in shown.stdout
    listed = run("distill", "list", "--user", "alice", "--json")
    assert listed.exit_code == 0 and {d["id"]: d["memory_type"] for d in json.loads(listed.stdout)["items"]}[target] == "fact"
    with database.connection() as conn:
        assert [d["after"] for _, d in _audit(conn, target)] == ["preference", "fact"]
