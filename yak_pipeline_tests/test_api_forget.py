"""Forget through the API (DESIGN §4): ids delete with everything derived; phrases need confirmation."""

from __future__ import annotations

from yak_pipeline.store.database import Database
from yak_pipeline_tests.api_fixtures import (  # noqa: F401
    Seeded,
    admin,
    api_settings,
    app,
    client_with,
    rows_mentioning,
    seeded,
)


def test_forget_by_id_leaves_no_row_in_any_table(app, seeded: Seeded, database: Database) -> None:  # noqa: ANN001
    a = seeded.alice
    alice = client_with(app, seeded.alice_key)
    response = alice.post("/api/forget", json={"command": f"/forget {a.memory_id}", "user_id": "alice"})
    assert response.status_code == 200
    body = response.json()
    assert body["action"] == "deleted" and body["deleted_memory_ids"] == [a.memory_id]
    assert body["deleted_distillation_ids"] == [a.distillation_id]
    with database.connection() as conn:
        # The audit log keeps the ids of what was forgotten (DESIGN §3), never the text.
        assert rows_mentioning(conn, a.memory_id, skip=("audit_log",)) == {}
        assert rows_mentioning(conn, a.distillation_id, skip=("audit_log",)) == {}
        # The other memory's text also contains the code; only the forgotten exchange's text is checked.
        assert rows_mentioning(conn, "My locker code is AZURE-7731.") == {}
        assert rows_mentioning(conn, "The user's locker code is AZURE-7731.") == {}
        assert conn.execute("SELECT count(*) FROM turns WHERE id = %s", (a.turn_id,)).fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM conflicts WHERE id = %s", (a.conflict_id,)).fetchone()[0] == 0
        audit = conn.execute("SELECT actor, target_id FROM audit_log WHERE action = 'forget'").fetchall()
        assert len(rows_mentioning(conn, seeded.bob.memory_id)) > 0
    assert audit == [(audit[0][0], a.memory_id)] and audit[0][0].startswith("api:key:")
    assert alice.get(f"/api/memories/{a.memory_id}").status_code == 404


def test_delete_memory_colon_and_forget_this_memory(admin, seeded: Seeded) -> None:  # noqa: ANN001
    by_distillation = admin.post("/api/forget", json={
        "command": f"delete memory: {seeded.alice.other_distillation_id}", "user_id": "alice"}).json()
    assert by_distillation["action"] == "deleted" and len(by_distillation["deleted_memory_ids"]) == 1
    in_context = admin.post("/api/forget", json={"command": "Forget this memory.", "user_id": "alice",
                                                 "context_memory_id": seeded.alice.memory_id}).json()
    assert in_context["deleted_memory_ids"] == [seeded.alice.memory_id]
    mixed = admin.post("/api/forget", json={
        "command": f"/forget {seeded.alice.review_id}, {seeded.bob.memory_id}", "user_id": "alice"}).json()
    assert mixed["deleted_distillation_ids"] == [seeded.alice.review_id]
    assert mixed["not_found"] == [seeded.bob.memory_id]
    assert admin.get(f"/api/memories/{seeded.bob.memory_id}").status_code == 200


def test_forget_by_phrase_needs_confirmation(app, seeded: Seeded, database: Database) -> None:  # noqa: ANN001
    alice = client_with(app, seeded.alice_key)
    asked = alice.post("/api/forget", json={"command": "/forget AZURE-7731 tea", "user_id": "alice"}).json()
    assert asked["action"] == "confirm" and asked["deleted_memory_ids"] == []
    assert [c["distillations"] for c in asked["candidates"]] == [["The user may like AZURE-7731 tea."]]
    token = asked["confirmation_token"]
    with database.connection() as conn:
        assert conn.execute("SELECT count(*) FROM memories WHERE user_id = 'alice'").fetchone()[0] == 3
        stored = conn.execute("SELECT token_hash FROM forget_confirmations").fetchone()[0]
    assert stored != token and token not in stored

    bob = client_with(app, seeded.bob_key)
    assert bob.post("/api/forget/confirm", json={"token": token, "user_id": "bob"}).status_code == 404
    forged = alice.post("/api/forget/confirm", json={"token": token[:-2] + "xx", "user_id": "alice"})
    assert forged.status_code == 404

    done = alice.post("/api/forget/confirm", json={"token": token, "user_id": "alice"}).json()
    assert done["action"] == "deleted" and done["deleted_distillation_ids"] == [seeded.alice.review_id]
    assert alice.post("/api/forget/confirm", json={"token": token, "user_id": "alice"}).status_code == 404
    nothing = alice.post("/api/forget", json={"command": "/forget no such words", "user_id": "alice"}).json()
    assert nothing["action"] == "nothing" and nothing["confirmation_token"] is None


def test_expired_tokens_do_not_work(admin, seeded: Seeded, database: Database) -> None:  # noqa: ANN001
    token = admin.post("/api/forget", json={"command": "/forget tea", "user_id": "alice"}).json()["confirmation_token"]
    with database.connection() as conn:
        conn.execute("UPDATE forget_confirmations SET created_at = now() - interval '1 hour', "
                     "expires_at = now() - interval '1 minute'")
    assert admin.post("/api/forget/confirm", json={"token": token, "user_id": "alice"}).status_code == 404


def test_soft_forget_hides_from_every_read_path(admin, seeded: Seeded, database: Database) -> None:  # noqa: ANN001
    a = seeded.alice
    response = admin.post("/api/forget", json={"command": f"/forget {a.memory_id}", "user_id": "alice", "soft": True})
    assert response.json()["action"] == "deleted"
    assert admin.get(f"/api/memories/{a.memory_id}").status_code == 404
    assert admin.get(f"/api/distillations/{a.distillation_id}").status_code == 404
    search = admin.post("/api/distillations/search", json={"query": "locker code AZURE-7731", "user_id": "alice",
                                                           "threshold": 0.0, "limit": 100}).json()
    assert a.distillation_id not in {h["id"] for h in search}
    with database.connection() as conn:
        assert conn.execute("SELECT deleted_at IS NOT NULL FROM memories WHERE id = %s", (a.memory_id,)).fetchone()[0]


def test_what_is_not_a_forget_command_is_422(admin, database: Database) -> None:  # noqa: ANN001
    for command, expected in [("please forget my address", "not a forget command"),
                              ("/forget", "needs a memory id or a phrase"),
                              ("forget this memory", "needs a memory in context"),
                              ("delete memory: my-address", "needs memory ids")]:
        response = admin.post("/api/forget", json={"command": command, "user_id": "alice"})
        assert response.status_code == 422, command
        assert response.json()["detail"].startswith("command: ") and expected in response.json()["detail"]
    missing = admin.post("/api/forget", json={"command": "/forget 00000000-0000-0000-0000-000000000000",
                                              "user_id": "alice"})
    assert missing.status_code == 404



def test_posting_a_soft_forgotten_exchange_again_is_409(admin, seeded: Seeded) -> None:  # noqa: ANN001
    # A soft forget keeps the row (hidden), and one row per user and text: the text cannot come
    # back, and saying so is a 409, not the 500 it was when the hidden row was read back as None.
    exchange = "User: My locker code is AZURE-7731.\nAssistant: Noted."
    response = admin.post("/api/forget", json={"command": f"/forget {seeded.alice.memory_id}", "user_id": "alice",
                                               "soft": True})
    assert response.json()["action"] == "deleted"
    again = admin.post("/api/memories", json={"user_id": "alice", "content": exchange})
    assert again.status_code == 409
    assert "forgot this exchange" in again.json()["detail"]
    assert admin.get(f"/api/memories/{seeded.alice.memory_id}").status_code == 404
    # Another user's same text is theirs to store.
    assert admin.post("/api/memories", json={"user_id": "carol", "content": exchange}).status_code == 201
