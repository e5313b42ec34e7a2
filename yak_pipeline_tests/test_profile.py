"""The profile (issue 39): the user's standing instructions and preferences in every block.

Through the real app on a real database: lines are found as each exchange is stored, every
``/api/context`` carries them apart from and ahead of the recalled memories (whatever the
question), ``/api/profile`` shows exactly what is sent, and a line leaves the profile in one
action (drop; forgetting its memory). Keys stay scoped; a read-only key cannot drop.
"""

from __future__ import annotations

from datetime import datetime, timezone

from pydantic import SecretStr

from yak_pipeline.api.app import create_app
from yak_pipeline.core.memory_block import BLOCK_PREAMBLE, PROFILE_PREAMBLE
from yak_pipeline.settings import Settings
from yak_pipeline.store.api_keys import create_api_key
from yak_pipeline.store.database import Database
from yak_pipeline.store.grown_exchanges import grow_exchange
from yak_pipeline.store.memories import insert_memory
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
    assert f'(instruction, said on ' in block and f'"{BRITISH}"' in block and f'"{MINIMAL}"' in block
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


def test_a_zero_budget_turns_the_profile_off(api_settings: Settings, database: Database) -> None:  # noqa: F811
    off = create_app(api_settings.model_copy(update={"profile_tokens": 0}), database=database)
    with client_with(off, ADMIN_KEY) as client:
        _add(client, "alice", BRITISH)
        body = _context(client)
        assert body["profile_ids"] == [] and BRITISH not in body["block"]
        shown = client.get("/api/profile", params={"user_id": "alice"}).json()
        assert shown["sent"] == [] and shown["lines"][0]["why_not_sent"] == "off (the profile budget is 0)"


def test_lines_follow_their_exchange_when_it_grows_and_come_back_on_a_rebuild(database: Database) -> None:
    when = datetime(2026, 11, 1, tzinfo=timezone.utc)
    with database.connection() as conn:
        memory = insert_memory(conn, user_id="alice", content="User: Always cite sources.\nAssistant: …",
                               source="import", occurred_at=when)
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
