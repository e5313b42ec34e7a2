"""Memory out (issue 14, parts 2 and 3): MEMORY.md (CLI, API route, MCP resource) and the JSONL
backup restored into a fresh database, through real ``yak`` subprocesses on the embedded server."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import anyio
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from yak_pipeline.api.dependencies import ApiServices
from yak_pipeline.api.mcp_server import MCP_PATH, MEMORY_RESOURCE_URI, build_mcp_server, mcp_http_app
from yak_pipeline.core.memory_markdown import render_memory_markdown
from yak_pipeline.embeddings.hashing import HashingEmbedder
from yak_pipeline.services.recall import recall_params, relevance_model, search_memories
from yak_pipeline.settings import Settings
from yak_pipeline.store.backup import BACKUP_TABLES
from yak_pipeline.store.database import Database, connect
from yak_pipeline_tests.api_fixtures import (  # noqa: F401 - fixtures
    ADMIN_KEY,
    Seeded,
    api_settings,
    app,
    client_with,
    seeded,
    serve_in_thread,
)
from yak_pipeline_tests.conftest import create_database, drop_database
from yak_pipeline_tests.test_history_import import CHATGPT_ZIP, CLAUDE, CLAUDE_CODE, yak, yak_env

QUERIES = {"maria": ["Where am I travelling in April?", "What food can't I eat?", "How do I make bread?",
                     "What language am I learning?", "Which indentation does the repository use?"],
           "alice": ["What is my locker code?"], "bob": ["What is my locker code?"]}
# Columns the database fills itself and that a restore gives anew (DESIGN: surrogate order only).
RENUMBERED = {"memories": ["seq"], "warmth_events": ["id"]}


def table_rows(url: str, table: str) -> list[str]:
    """Every row of ``table`` as JSON text, sorted, without the columns a restore renumbers."""
    with connect(url) as conn:
        return sorted(r[0] for r in conn.execute(
            f"SELECT (to_jsonb(t) - %s::text[])::text FROM {table} t",  # noqa: S608 - fixed names
            (RENUMBERED.get(table, []),)).fetchall())


def recall(url: str, settings: Settings, user: str, query: str) -> list[tuple[str, float]]:
    """The recall engine's answer, as (distillation id, score), at a fixed time."""
    db = Database(url, max_size=2).open()
    try:
        embedder = HashingEmbedder(384)
        hits = search_memories(db, embedder, user_id=user, query=query,
                               params=recall_params(settings, threshold=0.3, limit=10),
                               model=relevance_model(settings, embedder), now=datetime(2026, 1, 1, tzinfo=UTC))
        return [(str(h.id), round(h.score, 9)) for h in hits]
    finally:
        db.close()


def test_import_process_export_restore_gives_the_same_rows_and_the_same_recall(
        db_url: str, pg_server_url: str, seeded: Seeded, settings: Settings, tmp_path: Path) -> None:  # noqa: F811
    env = yak_env(db_url, tmp_path)
    imported = yak(["import", str(CHATGPT_ZIP), str(CLAUDE), str(CLAUDE_CODE), "--user", "maria", "--json"], env)
    assert imported.returncode == 0, imported.stderr
    processed = yak(["process", "--json"], env)
    assert processed.returncode == 0, processed.stderr[-2000:]
    backup = tmp_path / "yak-backup.jsonl"
    exported = yak(["export", "--all-users", "--format", "jsonl", "--output", str(backup), "--json"], env)
    assert exported.returncode == 0, exported.stderr
    summary = json.loads(exported.stdout)
    assert summary["users"] == ["alice", "bob", "maria"]
    assert summary["counts"]["memories"] == 11 + 6 and summary["counts"]["conflicts"] == 2
    assert summary["counts"]["turns"] == 2 and summary["counts"]["warmth_events"] == 2
    assert summary["counts"]["api_keys"] == 2 and summary["counts"]["distillation_versions"] >= 17
    # Never a key, nor what lets one in.
    text = backup.read_text()
    with connect(db_url) as conn:
        hashes = [r[0] for r in conn.execute("SELECT key_hash FROM api_keys").fetchall()]
    assert seeded.alice_key not in text and seeded.bob_key not in text
    assert hashes and not any(h in text for h in hashes) and "key_hash" not in text

    fresh_name = f"yak_restore_{uuid.uuid4().hex[:10]}"
    fresh_url = create_database(pg_server_url, fresh_name)  # empty: `yak restore` migrates it
    try:
        restored = yak(["restore", str(backup), "--json"], {**env, "YAK_DATABASE_URL": fresh_url})
        assert restored.returncode == 0, restored.stderr
        assert json.loads(restored.stdout)["keys_not_restored"] == 2
        for table in BACKUP_TABLES:
            if table != "api_keys":
                assert table_rows(fresh_url, table) == table_rows(db_url, table), table
        for user, queries in QUERIES.items():
            for query in queries:
                before = recall(db_url, settings, user, query)
                assert before, (user, query)
                assert recall(fresh_url, settings, user, query) == before, (user, query)
        md = yak(["export", "--user", "maria", "--format", "md"], env)
        assert md.returncode == 0
        assert yak(["export", "--user", "maria", "--format", "md"], {**env, "YAK_DATABASE_URL": fresh_url}).stdout == md.stdout
        # Restoring the same backup again: one line, nothing written.
        with connect(fresh_url) as conn:
            counts = [conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in BACKUP_TABLES]  # noqa: S608
        again = yak(["restore", str(backup)], {**env, "YAK_DATABASE_URL": fresh_url})
        assert again.returncode == 1 and "Traceback" not in again.stderr
        assert again.stderr.startswith("error: the database already holds memories of this backup (id ")
        assert len(again.stderr.strip().splitlines()) == 1
        with connect(fresh_url) as conn:
            assert [conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in BACKUP_TABLES] == counts  # noqa: S608
    finally:
        drop_database(pg_server_url, fresh_name)


def test_one_users_backup_restores_next_to_other_users_and_a_cut_copy_is_refused(
        db_url: str, pg_server_url: str, template_database: str, seeded: Seeded, tmp_path: Path) -> None:  # noqa: F811
    env = yak_env(db_url, tmp_path)
    backup = tmp_path / "alice.jsonl"
    assert yak(["export", "--user", "alice", "--format", "jsonl", "-o", str(backup)], env).returncode == 0
    lines = backup.read_text().splitlines()
    assert {json.loads(line)["row"].get("user_id", "alice") for line in lines[1:-1]} == {"alice"}
    other_name = f"yak_restore_{uuid.uuid4().hex[:10]}"
    other_url = create_database(pg_server_url, other_name, template=template_database)
    try:
        other = {**env, "YAK_DATABASE_URL": other_url}
        cut = tmp_path / "cut.jsonl"
        cut.write_text("\n".join(lines[:-3]) + "\n")
        refused = yak(["restore", str(cut)], other)
        assert refused.returncode == 1 and "is incomplete" in refused.stderr and "Traceback" not in refused.stderr
        not_backup = yak(["restore", str(CLAUDE)], other)
        assert not_backup.returncode == 1 and "is not a Yak backup" in not_backup.stderr
        with connect(other_url) as conn:
            assert conn.execute("SELECT count(*) FROM memories").fetchone()[0] == 0
            # Someone else's memory is there already: a restore of alice's sits beside it.
            conn.execute("""INSERT INTO memories (user_id, content, source, content_sha256)
                            VALUES ('carol', 'User: hi\nAssistant: hello', 'api', repeat('a', 64))""")
            conn.commit()
        assert yak(["restore", str(backup)], other).returncode == 0
        with connect(other_url) as conn:
            users = conn.execute("SELECT user_id, count(*) FROM memories GROUP BY 1 ORDER BY 1").fetchall()
            assert users == [("alice", 3), ("carol", 1)]
            assert conn.execute("SELECT count(*) FROM warmth_events WHERE user_id = 'alice'").fetchone()[0] == 1
    finally:
        drop_database(pg_server_url, other_name)


def test_export_refuses_unclear_requests_in_one_line(db_url: str, tmp_path: Path) -> None:
    env = yak_env(db_url, tmp_path)
    for args, message in ((["export", "--format", "md"], "give --user U"),
                          (["export", "--format", "jsonl"], "give --user U or --all-users"),
                          (["export", "--format", "jsonl", "--all-users", "--json"], "give --output FILE"),
                          (["export", "--user", "nobody", "--format", "md"], "user 'nobody' has no memories")):
        result = yak(args, env)
        assert result.returncode in (1, 2) and message in result.stderr and "Traceback" not in result.stderr, args


# --- MEMORY.md -----------------------------------------------------------------------------------


def test_memory_md_lists_current_knowledge_by_tier_and_diffs_cleanly(
        db_url: str, database: Database, seeded: Seeded, tmp_path: Path) -> None:  # noqa: F811
    env = yak_env(db_url, tmp_path)
    first = yak(["export", "--user", "alice", "--format", "md"], env)
    assert first.returncode == 0, first.stderr
    text = first.stdout
    with database.connection() as conn:
        # Alice's two contradicting memories: the one stated first is superseded by the other.
        conn.execute("UPDATE distillations SET superseded_by = %s, superseded_at = now() WHERE id = %s",
                     (seeded.alice.other_distillation_id, seeded.alice.distillation_id))
    text = yak(["export", "--user", "alice", "--format", "md"], env).stdout
    with database.connection() as conn:
        superseded = conn.execute("SELECT content FROM distillations WHERE user_id = 'alice' AND superseded_by IS NOT NULL"
                                  ).fetchall()
        current = conn.execute("""SELECT content, tier, refreshed_at FROM distillations
                                  WHERE user_id = 'alice' AND status = 'active' AND superseded_by IS NULL""").fetchall()
    assert len(superseded) == 1 and superseded[0][0] not in text
    assert "The user may like AZURE-7731 tea." not in text  # held for review
    for content, _tier, refreshed in current:
        assert f"- {refreshed.astimezone(UTC).date()}: {content}" in text
    assert "CRIMSON" not in text  # bob's
    # A new memory lands at the end of its section; nothing else moves.
    with database.connection() as conn:
        from yak_pipeline_tests.store_helpers import seed_memory_with_distillation
        seed_memory_with_distillation(conn, user_id="alice", exchange="User: I moved to Ghent.\nAssistant: Noted.",
                                      distillation="The user lives in Ghent.", tier="medium")
    second = yak(["export", "--user", "alice", "--format", "md"], env).stdout
    added = [line for line in second.splitlines() if line not in text.splitlines()]
    removed = [line for line in text.splitlines() if line not in second.splitlines()]
    assert len(added) == 2 and added[1].endswith(": The user lives in Ghent.")  # and the header's count
    assert len(removed) == 1 and removed[0].startswith("What Yak knows about alice: 1 memory,")
    assert yak(["export", "--user", "alice", "--format", "md"], env).stdout == second
    out = tmp_path / "MEMORY.md"
    written = yak(["export", "--user", "alice", "--format", "md", "-o", str(out), "--json"], env)
    assert json.loads(written.stdout) == {"user_id": "alice", "memories": 2, "output": str(out)}
    assert out.read_text() == second


def test_render_memory_markdown_orders_by_tier_date_and_text() -> None:
    day = lambda d: datetime(2026, 1, d, 23, 30, tzinfo=UTC)  # noqa: E731
    items = [{"content": "Likes  tea.\n", "tier": "low", "refreshed_at": day(3), "needs_review": False},
             {"content": "Lives in Lisbon.", "tier": "core", "refreshed_at": day(2), "needs_review": True},
             {"content": "Is a nurse.", "tier": "core", "refreshed_at": day(2), "needs_review": False}]
    text = render_memory_markdown("maria", items)
    assert text == render_memory_markdown("maria", list(reversed(items)))
    assert text.splitlines()[4:] == [
        "## Facts — who the user is, what they do", "",
        "### Core — who the user is, what matters most", "",
        "- 2026-01-02: Is a nurse.", "- 2026-01-02: Lives in Lisbon. _(unreviewed)_", "",
        "### Low — passing details", "", "- 2026-01-03: Likes tea."]


def test_render_memory_markdown_has_a_section_per_type_and_events_by_their_day() -> None:
    said = lambda d: datetime(2026, 11, d, 9, 0, tzinfo=UTC)  # noqa: E731
    items = [
        {"content": "User finished the migration last Tuesday.", "tier": "medium", "refreshed_at": said(27),
         "memory_type": "event", "event_on": date(2026, 11, 24)},
        {"content": "User's exam is on 3 May.", "tier": "core", "refreshed_at": said(20),
         "memory_type": "event", "event_on": date(2027, 5, 3)},
        {"content": "User had a big day.", "tier": "low", "refreshed_at": said(25), "memory_type": "event",
         "event_on": None},
        {"content": "User prefers trains.", "tier": "medium", "refreshed_at": said(2), "memory_type": "preference"},
        {"content": "User wants answers in French.", "tier": "core", "refreshed_at": said(3),
         "memory_type": "instruction", "needs_review": True},
        {"content": "User lives in Lyon.", "tier": "core", "refreshed_at": said(1), "memory_type": "fact"},
    ]
    text = render_memory_markdown("maria", items, [("instruction", "Always answer in French.", said(3))])
    assert text == render_memory_markdown("maria", list(reversed(items)),
                                          [("instruction", "Always answer in French.", said(3))])
    assert text.splitlines()[2:] == [
        "## How to answer — standing instructions and preferences, in the user's words", "",
        '- 2026-11-03 (instruction): "Always answer in French."', "",
        "What Yak knows about maria: 6 memories, the latest from 2026-11-27. Rebuilt from the database at any "
        "time; superseded memories and those held back for review are left out.", "",
        "## Instructions — how the user wants to be answered", "",
        "- 2026-11-03: User wants answers in French. _(unreviewed)_", "",
        "## Preferences — what the user prefers", "", "- 2026-11-02: User prefers trains.", "",
        "## Facts — who the user is, what they do", "",
        "### Core — who the user is, what matters most", "", "- 2026-11-01: User lives in Lyon.", "",
        "## Events — what happened, or will, by day", "",
        "- 2026-11-24 (said 2026-11-27): User finished the migration last Tuesday.",
        "- 2026-11-25: User had a big day.",
        "- 2027-05-03 (said 2026-11-20): User's exam is on 3 May."]


def test_memory_md_route_and_mcp_resource_serve_the_keys_user(
        app, api_settings: Settings, database: Database, seeded: Seeded) -> None:  # noqa: F811
    with client_with(app, seeded.alice_key) as alice:
        own = alice.get("/api/export/memory.md")
        assert own.status_code == 200 and own.headers["content-type"].startswith("text/markdown")
        assert "AZURE-7731" in own.text and "CRIMSON" not in own.text
        assert alice.get("/api/export/memory.md", params={"user_id": "bob"}).status_code in (403, 404)
    with client_with(app, ADMIN_KEY) as admin_client:
        assert admin_client.get("/api/export/memory.md", params={"user_id": "alice"}).text == own.text
        assert admin_client.get("/api/export/memory.md").status_code == 422
        missing = admin_client.get("/api/export/memory.md", params={"user_id": "nobody"})
        assert missing.status_code == 404 and missing.json()["detail"] == "user 'nobody' has no memories"

    services = ApiServices.of(api_settings, database=database)
    with serve_in_thread(mcp_http_app(services)) as url:
        async def read(key: str, uri: str = MEMORY_RESOURCE_URI) -> Any:
            client = Client(streamable_http_client(f"{url}{MCP_PATH}", http_client=httpx2.AsyncClient(
                headers={"Authorization": f"Bearer {key}"}, timeout=30)))
            async with client:
                templates = [t.uri_template for t in (await client.list_resource_templates()).resource_templates]
                assert templates == [MEMORY_RESOURCE_URI + "{?user_id}"]
                try:
                    return (await client.read_resource(uri)).contents[0]
                except Exception as exc:  # noqa: BLE001 - the refusal's text is what is checked
                    return exc

        content = anyio.run(read, seeded.alice_key)
        assert content.text == own.text and content.mime_type == "text/markdown"
        assert "CRIMSON-4402" in anyio.run(read, seeded.bob_key).text
        refused = anyio.run(read, seeded.bob_key, MEMORY_RESOURCE_URI + "?user_id=alice")
        assert "reads only the MEMORY.md of bob" in str(refused)

    # Over stdio the process acts for --user, and the resource is listed as such.
    stdio_server = build_mcp_server(services, user="alice")

    async def read_stdio() -> tuple[list[str], str]:
        listed = [str(r.uri) for r in await stdio_server.list_resources()]
        [result] = await stdio_server.read_resource(MEMORY_RESOURCE_URI)
        return listed, result.content

    listed, text = anyio.run(read_stdio)
    assert listed == [MEMORY_RESOURCE_URI] and text == own.text


def test_the_readme_shows_the_memory_md_yak_writes_for_demo(db_url: str, tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    shown = readme.split("The MEMORY.md of `demo`", 1)[1].split("```markdown\n", 1)[1].split("\n```", 1)[0]
    env = yak_env(db_url, tmp_path)
    drop = tmp_path / "drop"
    drop.mkdir()
    for example in (root / "examples" / "drop").iterdir():
        (drop / example.name).write_bytes(example.read_bytes())
    assert yak(["process", "--json"], env).returncode == 0
    written = yak(["export", "--user", "demo", "--format", "md"], env)
    assert written.returncode == 0 and written.stdout == shown + "\n"
