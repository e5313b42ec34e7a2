"""A user-scoped key never reads, finds, changes or deletes another user's data, on any route."""

from __future__ import annotations

import pytest

from yak_pipeline.store.database import Database
from yak_pipeline_tests.api_fixtures import (  # noqa: F401
    Seeded,
    admin,
    api_settings,
    app,
    client_with,
    seeded,
)


def _bobs_id_routes(s: Seeded) -> list[tuple[str, str, dict | None]]:
    """Every route that takes an id, aimed at Bob's rows."""
    b = s.bob
    return [
        ("GET", f"/api/memories/{b.memory_id}", None),
        ("DELETE", f"/api/memories/{b.memory_id}", None),
        ("GET", f"/api/distillations/{b.distillation_id}", None),
        ("POST", f"/api/distillations/{b.distillation_id}/versions", {"content": "Overwritten by alice."}),
        ("POST", f"/api/distillations/{b.distillation_id}/re-embed", None),
        ("POST", "/api/distillations/merge", {"keep_id": b.distillation_id, "merge_id": b.other_distillation_id,
                                              "content": "Merged by alice."}),
        ("POST", "/api/distillations/merge", {"keep_id": s.alice.distillation_id, "merge_id": b.distillation_id,
                                              "content": "Merged by alice."}),
        ("GET", f"/api/warmth/{b.distillation_id}", None),
        ("POST", f"/api/warmth/{b.distillation_id}/reset", None),
        ("POST", "/api/warmth/evaluate", {"memory_id": b.distillation_id, "context": "User: hi\nAssistant: hi"}),
        ("POST", f"/api/review/{b.review_id}/approve", None),
        ("POST", f"/api/review/{b.review_id}/reject", None),
        ("POST", f"/api/conflicts/{b.conflict_id}/resolve", None),
        ("POST", f"/api/conflicts/{b.conflict_id}/dismiss", None),
        ("POST", "/api/forget", {"command": f"/forget {b.memory_id}", "user_id": "alice"}),
        ("POST", "/api/forget", {"command": f"delete memory: {b.distillation_id}", "user_id": "alice"}),
        ("POST", "/api/forget", {"command": "forget this memory", "user_id": "alice",
                                 "context_memory_id": b.memory_id}),
    ]


def _state(database: Database, user_id: str) -> tuple:
    with database.connection() as conn:
        return (
            conn.execute("SELECT id, content, status FROM memories WHERE user_id = %s ORDER BY id", (user_id,)).fetchall(),
            conn.execute("""SELECT id, content, status, warmth, needs_review, embedding::text FROM distillations
                            WHERE user_id = %s ORDER BY id""", (user_id,)).fetchall(),
            conn.execute("SELECT count(*) FROM distillation_versions v JOIN distillations d ON d.id = v.distillation_id "
                         "WHERE d.user_id = %s", (user_id,)).fetchone(),
            conn.execute("SELECT id, status FROM conflicts WHERE user_id = %s", (user_id,)).fetchall(),
            conn.execute("SELECT count(*) FROM warmth_events WHERE user_id = %s", (user_id,)).fetchone(),
        )


def test_another_users_ids_are_404_on_every_route(app, seeded: Seeded, database: Database) -> None:  # noqa: ANN001
    before = _state(database, "bob")
    alice = client_with(app, seeded.alice_key)
    for method, path, body in _bobs_id_routes(seeded):
        response = alice.request(method, path, json=body)
        assert response.status_code == 404, (method, path, response.text)
        assert seeded.bob.secret not in response.text
    assert _state(database, "bob") == before


def test_the_same_routes_work_for_the_owner(app, seeded: Seeded) -> None:  # noqa: ANN001
    bob = client_with(app, seeded.bob_key)
    assert bob.get(f"/api/memories/{seeded.bob.memory_id}").json()["content"].startswith("User: My locker code")
    assert bob.get(f"/api/distillations/{seeded.bob.distillation_id}").status_code == 200
    assert bob.get(f"/api/warmth/{seeded.bob.distillation_id}").json()["warmth"] == pytest.approx(0.6)


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "/api/memories/", {"content": "User: hi\nAssistant: hi", "user_id": "bob"}),
    ("POST", "/api/distillations/search", {"query": "locker code", "user_id": "bob"}),
    ("POST", "/api/context", {"query": "locker code", "user_id": "bob"}),
    ("POST", "/api/turns", {"user_id": "bob", "user_message": "hi", "assistant_message": "hi"}),
    ("POST", "/api/warmth/bulk-reset", {"user_id": "bob"}),
    ("POST", "/api/forget", {"command": "/forget locker", "user_id": "bob"}),
    ("GET", "/api/memories?user_id=bob", None),
    ("GET", "/api/distillations?user_id=bob", None),
    ("GET", "/api/review?user_id=bob", None),
    ("GET", "/api/conflicts?user_id=bob", None),
    ("GET", "/api/queue?user_id=bob", None),
])
def test_acting_for_another_user_is_refused(app, seeded: Seeded, database: Database,  # noqa: ANN001
                                            method: str, path: str, body: dict | None) -> None:
    before = _state(database, "bob")
    response = client_with(app, seeded.alice_key).request(method, path, json=body)
    assert response.status_code == 403
    assert response.json()["detail"] == "this API key is scoped to another user"
    assert seeded.bob.secret not in response.text
    assert _state(database, "bob") == before


def test_listings_and_recall_show_only_the_keys_user(app, seeded: Seeded) -> None:  # noqa: ANN001
    alice = client_with(app, seeded.alice_key)
    answers = {
        "memories": alice.get("/api/memories"),
        "distillations": alice.get("/api/distillations"),
        "review": alice.get("/api/review"),
        "conflicts": alice.get("/api/conflicts", params={"status": "all"}),
        "queue": alice.get("/api/queue"),
        "search": alice.post("/api/distillations/search",
                             json={"query": "locker code CRIMSON-4402 AZURE-7731", "user_id": "alice",
                                   "threshold": 0.0, "limit": 100}),
        "context": alice.post("/api/context", json={"query": "what is my locker code", "user_id": "alice",
                                                    "threshold": 0.0, "limit": 100}),
        "forget": alice.post("/api/forget", json={"command": "/forget CRIMSON", "user_id": "alice"}),
    }
    for name, response in answers.items():
        assert response.status_code == 200, name
        assert seeded.bob.secret not in response.text, name
        assert "bob" not in response.text, name
    assert answers["forget"].json()["action"] == "nothing"
    assert {m["user_id"] for m in answers["memories"].json()["items"]} == {"alice"}
    assert len(answers["review"].json()) == 3 and len(answers["conflicts"].json()) == 1
    assert seeded.alice.secret in answers["search"].text and seeded.alice.secret in answers["context"].text
    assert answers["queue"].json()["pending_turns"] == 1


def test_recalled_ids_of_another_user_are_dropped_from_a_turn(app, seeded: Seeded, database: Database) -> None:  # noqa: ANN001
    alice = client_with(app, seeded.alice_key)
    response = alice.post("/api/turns", json={
        "user_id": "alice", "user_message": "Where is my locker?", "assistant_message": "Gym.",
        "recalled_ids": [seeded.alice.distillation_id, seeded.bob.distillation_id]})
    assert response.status_code == 202
    with database.connection() as conn:
        recalled = conn.execute("SELECT recalled_ids FROM turns WHERE id = %s",
                                (response.json()["turn_id"],)).fetchone()[0]
    assert [str(r) for r in recalled] == [seeded.alice.distillation_id]


def test_admin_keys_see_everyone(admin, seeded: Seeded) -> None:  # noqa: ANN001
    users = {m["user_id"] for m in admin.get("/api/memories").json()["items"]}
    assert users == {"alice", "bob"}
    assert admin.get(f"/api/memories/{seeded.bob.memory_id}").status_code == 200
