"""The profile (issue 39): the user's standing instructions and preferences in every block.

Through the real app on a real database: lines are found as each exchange is stored, every
``/api/context`` carries them apart from and ahead of the recalled memories (whatever the
question), ``/api/profile`` shows exactly what is sent, and a line leaves the profile in one
action (drop; forgetting its memory). Keys stay scoped; a read-only key cannot drop.
"""

from __future__ import annotations

from datetime import UTC, datetime

from yak_pipeline.api.app import create_app
from yak_pipeline.core.memory_block import BLOCK_PREAMBLE, PROFILE_PREAMBLE
from yak_pipeline.settings import Settings
from yak_pipeline.store.api_keys import create_api_key
from yak_pipeline.store.database import Database
from yak_pipeline.store.grown_exchanges import grow_exchange
from yak_pipeline.store.memories import insert_memory, new_exchange
from yak_pipeline.store.profile import profile_lines, rebuild_profile_lines, set_profile_line_status
from yak_pipeline_tests.api_fixtures import ADMIN_KEY, admin, api_settings, app, client_with  # noqa: F401

BRITISH = "Always answer me in British English."
MINIMAL = "I prefer minimal dependencies"
CODING = "How do I add a login page to my Flask app?"


def _add(client, user: str, said: str, answer: str = "Noted.") -> str:  # noqa: ANN001
    response = client.post("/api/memories/", json={"content": f"User: {said}\nAssistant: {answer}", "user_id": user})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _context(client, user: str = "alice", query: str = CODING) -> dict:  # noqa: ANN001
    response = client.post("/api/context", json={"query": query, "user_id": user})
    assert response.status_code == 200, response.text
    return response.json()


def test_every_block_carries_the_users_instructions_and_preferences_apart_and_first(admin) -> None:  # noqa: ANN001
    _add(admin, "alice", "My sister Ines lives in Lisbon.")
    _add(admin, "alice", f"{BRITISH} Thanks!")
    _add(admin, "alice", f"I'm building a small tool, so {MINIMAL}, can you suggest a layout?")
    _add(admin, "bob", "Always answer in French.")

    body = _context(admin)
    block = body["block"]
    assert len(body["profile_ids"]) == 2
    assert block.startswith(f"<memories>\n{PROFILE_PREAMBLE}\n")
    assert '(instruction, said on ' in block and f'"{BRITISH}"' in block and f'"{MINIMAL}"' in block
    # Instructions first; the profile before anything recalled; another user's never.
    assert block.index(BRITISH) < block.index(MINIMAL)
    assert BLOCK_PREAMBLE not in block or block.index(MINIMAL) < block.index(BLOCK_PREAMBLE)
    assert "French" not in block

    # A question about something recalled gets both parts, each with its own preamble.
    asked = _context(admin, query="Where does my sister Ines live? Lisbon")
    assert "Ines" in asked["block"] and asked["block"].index(PROFILE_PREAMBLE) < asked["block"].index(BLOCK_PREAMBLE)
    assert set(asked["profile_ids"]) == set(body["profile_ids"]) and asked["recalled_ids"]

    shown = admin.get("/api/profile", params={"user_id": "alice"}).json()
    assert [line["text"] for line in shown["sent"]] == [BRITISH, MINIMAL]
    assert [line["id"] for line in shown["sent"]] == body["profile_ids"]
    assert shown["token_budget"] == 300 and all(line["sent"] for line in shown["lines"])


def test_a_line_leaves_the_profile_in_one_action_drop_or_forget(admin, database: Database) -> None:  # noqa: ANN001
    instruction_memory = _add(admin, "alice", BRITISH)
    preference_memory = _add(admin, "alice", f"{MINIMAL}.")
    lines = {line["text"]: line for line in admin.get("/api/profile", params={"user_id": "alice"}).json()["lines"]}

    dropped = admin.post("/api/profile/drop", json={"user_id": "alice", "ids": [lines[MINIMAL]["id"]]})
    assert dropped.status_code == 200 and dropped.json()["changed"] == [lines[MINIMAL]["id"]]
    assert MINIMAL not in _context(admin)["block"] and BRITISH in _context(admin)["block"]
    after = {line["text"]: line for line in admin.get("/api/profile", params={"user_id": "alice"}).json()["lines"]}
    assert after[MINIMAL]["dropped"] and after[MINIMAL]["why_not_sent"] == "dropped from the profile"
    # The exchange stays a memory; dropping twice finds nothing to change.
    assert admin.get(f"/api/memories/{preference_memory}").status_code == 200
    assert admin.post("/api/profile/drop", json={"user_id": "alice", "ids": [lines[MINIMAL]["id"]]}).status_code == 404
    kept = admin.post("/api/profile/drop", json={"user_id": "alice", "ids": [lines[MINIMAL]["id"]], "keep": True})
    assert kept.status_code == 200 and MINIMAL in _context(admin)["block"]

    # Forgetting the memory takes its line with it.
    forgot = admin.post("/api/forget", json={"user_id": "alice", "command": f"/forget {instruction_memory}"})
    assert forgot.status_code == 200 and forgot.json()["action"] == "deleted"
    block = _context(admin)["block"]
    assert BRITISH not in block and MINIMAL in block
    with database.connection() as conn:
        assert [line.text for line in profile_lines(conn, "alice", include_dropped=True)] == [MINIMAL]


def test_keys_stay_scoped_and_a_read_only_key_cannot_drop(app, database: Database) -> None:  # noqa: ANN001
    with database.connection() as conn:
        _, alice_key = create_api_key(conn, user_id="alice")
        _, reader_key = create_api_key(conn, user_id="alice", read_only=True)
        _, bob_key = create_api_key(conn, user_id="bob")
    with client_with(app, alice_key) as alice, client_with(app, reader_key) as reader, \
            client_with(app, bob_key) as bob:
        _add(alice, "alice", BRITISH)
        line = alice.get("/api/profile", params={"user_id": "alice"}).json()["sent"][0]
        assert bob.get("/api/profile", params={"user_id": "alice"}).status_code == 403
        assert bob.post("/api/profile/drop", json={"user_id": "alice", "ids": [line["id"]]}).status_code == 403
        assert reader.get("/api/profile", params={"user_id": "alice"}).json()["sent"] == [line]
        refused = reader.post("/api/profile/drop", json={"user_id": "alice", "ids": [line["id"]]})
        assert refused.status_code == 403 and "read-only" in refused.json()["detail"]
        assert alice.get("/api/profile", params={"user_id": "alice"}).json()["sent"] == [line]
        # Another user's line id in one's own name changes nothing (404), and stays in their profile.
        _add(bob, "bob", "Always answer in Norwegian.")
        bobs = bob.get("/api/profile", params={"user_id": "bob"}).json()["sent"][0]
        assert alice.post("/api/profile/drop", json={"user_id": "alice", "ids": [bobs["id"]]}).status_code == 404
        assert bob.get("/api/profile", params={"user_id": "bob"}).json()["sent"] == [bobs]


def test_a_zero_budget_turns_the_profile_off(api_settings: Settings, database: Database) -> None:  # noqa: F811
    off = create_app(api_settings.model_copy(update={"profile_tokens": 0}), database=database)
    with client_with(off, ADMIN_KEY) as client:
        _add(client, "alice", BRITISH)
        body = _context(client)
        assert body["profile_ids"] == [] and BRITISH not in body["block"]
        shown = client.get("/api/profile", params={"user_id": "alice"}).json()
        assert shown["sent"] == [] and shown["lines"][0]["why_not_sent"] == "off (the profile budget is 0)"


def test_lines_follow_their_exchange_when_it_grows_and_come_back_on_a_rebuild(database: Database) -> None:
    when = datetime(2026, 11, 1, tzinfo=UTC)
    with database.connection() as conn:
        memory = insert_memory(conn, new_exchange(user_id="alice", content="User: Always cite sources.\nAssistant: …",
                                                  source="import", occurred_at=when))
        [line] = profile_lines(conn, "alice")
        assert (line.kind, line.text, line.said_at) == ("instruction", "Always cite sources.", when)
        set_profile_line_status(conn, [line.id], user_id="alice", status="dropped", actor="test")
        # The exchange grows (an import of a session still open): its lines are read again; the
        # dropped one stays dropped, the new one joins.
        assert grow_exchange(conn, memory.id, user_id="alice",
                             content="User: Always cite sources. I prefer short answers.\nAssistant: Sure.")
        lines = profile_lines(conn, "alice", include_dropped=True)
        assert sorted((x.text, x.dropped) for x in lines) == [("Always cite sources.", True),
                                                            ("I prefer short answers", False)]
        # What the migration does for an existing database: read every exchange again.
        conn.execute("DELETE FROM profile_lines")
        assert rebuild_profile_lines(conn) == 1
        assert sorted(x.text for x in profile_lines(conn, "alice")) == ["Always cite sources.", "I prefer short answers"]


def test_the_page_shows_what_is_sent_and_drops_or_puts_back_a_line(app, database: Database) -> None:  # noqa: ANN001
    from yak_pipeline_tests.test_web_page import signed_in

    with database.connection() as conn:
        insert_memory(conn, new_exchange(user_id="alice", content=f"User: {BRITISH}\nAssistant: Right.", source="api"))
        insert_memory(conn, new_exchange(user_id="alice", content=f"User: {MINIMAL}.\nAssistant: Noted.", source="api"))
        [line] = [x for x in profile_lines(conn, "alice") if x.text == MINIMAL]
    client, csrf = signed_in(app, ADMIN_KEY)
    page = client.get("/ui/u/alice/profile")
    assert page.status_code == 200 and BRITISH in page.text and MINIMAL in page.text
    assert page.text.count('class="sent">sent<') == 2 and 'href="/ui/u/alice/profile"' in page.text
    dropped = client.post(f"/ui/u/alice/profile/{line.id}", data={"csrf_token": csrf})
    assert dropped.status_code == 303 and dropped.headers["location"].endswith("/ui/u/alice/profile")
    after = client.get("/ui/u/alice/profile").text
    assert "dropped from the profile: blocks no longer carry it" in after
    assert "not sent: dropped from the profile" in after and after.count('class="sent">sent<') == 1
    with database.connection() as conn:
        assert [x.text for x in profile_lines(conn, "alice")] == [BRITISH]
    client.post(f"/ui/u/alice/profile/{line.id}", data={"csrf_token": csrf, "keep": "true"})
    with database.connection() as conn:
        assert sorted(x.text for x in profile_lines(conn, "alice")) == [BRITISH, MINIMAL]
    # Without the session's token nothing changes.
    assert client.post(f"/ui/u/alice/profile/{line.id}", data={"csrf_token": "forged"}).status_code in (400, 403)


def test_through_a_real_yak_serve_the_profile_rides_every_context_until_forgotten(db_url: str, tmp_path) -> None:  # noqa: ANN001
    """Issue 39's done-when: two standing statements, an unrelated coding question, then "forget that preference"."""
    import json
    import os
    import subprocess

    import httpx

    from yak_pipeline_tests.test_cli_serve import YAK, start_serve, stop_serve

    home = tmp_path / "home"
    env = {**os.environ, "YAK_DATABASE_URL": db_url, "YAK_EMBEDDER": "hashing", "YAK_HOME": str(home)}
    process, url, _ = start_serve(env, tmp_path)

    def yak(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(YAK), *args], env=env, capture_output=True, text=True, timeout=120)

    try:
        for said in (f"User: {BRITISH}\nAssistant: Certainly.", f"User: {MINIMAL}.\nAssistant: Noted."):
            assert yak("memory", "add", said, "--user", "alice").returncode == 0
        key = (home / "admin-api-key").read_text().strip()
        api = httpx.Client(base_url=url, headers={"X-API-Key": key}, timeout=30)
        body = api.post("/api/context", json={"query": CODING, "user_id": "alice"}).json()
        profile_part = body["block"].split(BLOCK_PREAMBLE)[0]
        assert profile_part.startswith(f"<memories>\n{PROFILE_PREAMBLE}")
        assert BRITISH in profile_part and MINIMAL in profile_part and len(body["profile_ids"]) == 2

        shown = json.loads(yak("profile", "show", "--user", "alice", "--json").stdout)
        assert [line["id"] for line in shown["sent"]] == body["profile_ids"]
        printed = yak("context", CODING, "--user", "alice")
        assert printed.returncode == 0 and printed.stdout.rstrip("\n") == body["block"]

        asked = api.post("/api/forget", json={"user_id": "alice", "command": "/forget that preference"}).json()
        assert asked["action"] == "confirm" and [c["content"] for c in asked["candidates"]] == [
            f"User: {MINIMAL}.\nAssistant: Noted."]
        done = api.post("/api/forget/confirm", json={"user_id": "alice", "token": asked["confirmation_token"]})
        assert done.status_code == 200 and done.json()["action"] == "deleted"
        after = api.post("/api/context", json={"query": CODING, "user_id": "alice"}).json()
        assert BRITISH in after["block"] and MINIMAL not in after["block"] and len(after["profile_ids"]) == 1
    finally:
        stop_serve(process)


def test_memory_md_lists_the_profile_first(admin) -> None:  # noqa: ANN001
    _add(admin, "alice", BRITISH)
    _add(admin, "alice", f"{MINIMAL}.")
    text = admin.get("/api/export/memory.md", params={"user_id": "alice"}).text
    day = datetime.now(UTC).date().isoformat()
    assert text.startswith("# MEMORY.md: alice\n\n## How to answer — standing instructions and preferences")
    assert f'- {day} (instruction): "{BRITISH}"' in text and f'- {day} (preference): "{MINIMAL}"' in text
