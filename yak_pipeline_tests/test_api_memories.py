"""The memories routes and the API's answers to bad input: 422 with field and reason, 404, 413, 401."""

from __future__ import annotations

import uuid

import pytest

from yak_pipeline.store.database import Database
from yak_pipeline_tests.api_fixtures import ADMIN_KEY, admin, api_settings, app, client_with  # noqa: F401

EXCHANGE = "User: I adopted a cat named Miso.\nAssistant: Congratulations on Miso!"


def test_post_memory_stores_it_pending_once(admin, database: Database) -> None:  # noqa: ANN001
    first = admin.post("/api/memories/", json={"content": EXCHANGE, "user_id": "alice",
                                               "occurred_at": "2026-03-01T10:00:00+01:00"})
    assert first.status_code == 201
    body = first.json()
    assert body["content"] == EXCHANGE and body["user_id"] == "alice" and body["status"] == "pending"
    assert body["occurred_at"].startswith("2026-03-01T09:00:00")
    assert set(body) >= {"id", "content", "user_id", "created_at"}

    again = admin.post("/api/memories", json={"content": EXCHANGE + "\r\n", "user_id": "alice"})
    assert again.status_code == 200 and again.json()["id"] == body["id"]
    with database.connection() as conn:
        rows = conn.execute("SELECT status, source FROM memories").fetchall()
        audit = conn.execute("SELECT actor FROM audit_log WHERE action = 'ingest'").fetchall()
    assert rows == [("pending", "api")]
    assert audit == [("api:admin",)]


def test_list_show_and_delete(admin) -> None:  # noqa: ANN001
    ids = [admin.post("/api/memories/", json={"content": f"User: fact {i}\nAssistant: ok", "user_id": "alice",
                                              "occurred_at": f"2026-01-0{i + 1}T00:00:00Z"}).json()["id"]
           for i in range(3)]
    admin.post("/api/memories/", json={"content": "User: bob's\nAssistant: ok", "user_id": "bob"})

    page = admin.get("/api/memories", params={"user_id": "alice", "limit": 2}).json()
    assert [m["id"] for m in page["items"]] == [ids[2], ids[1]] and page["next_offset"] == 2
    last = admin.get("/api/memories", params={"user_id": "alice", "limit": 2, "offset": 2}).json()
    assert [m["id"] for m in last["items"]] == [ids[0]] and last["next_offset"] is None
    assert len(admin.get("/api/memories").json()["items"]) == 4

    shown = admin.get(f"/api/memories/{ids[0]}").json()
    assert shown["content"] == "User: fact 0\nAssistant: ok" and shown["distillations"] == []

    deleted = admin.delete(f"/api/memories/{ids[0]}")
    assert deleted.status_code == 200 and deleted.json()["deleted_memory_ids"] == [ids[0]]
    assert admin.get(f"/api/memories/{ids[0]}").status_code == 404
    assert admin.delete(f"/api/memories/{ids[0]}").status_code == 404


@pytest.mark.parametrize(("body", "field"), [
    ({"content": "x", "user_id": "bad user"}, "user_id"),
    ({"content": "x", "user_id": "a|b"}, "user_id"),
    ({"content": "   \n ", "user_id": "alice"}, "content"),
    ({"content": "nul\x00byte", "user_id": "alice"}, "content"),
    ({"user_id": "alice"}, "content"),
    ({"content": "x", "user_id": "alice", "occurred_at": "2026-01-01T00:00:00"}, "occurred_at"),
    ({"content": "x", "user_id": "alice", "occurred_at": "1999-12-31T00:00:00Z"}, "occurred_at"),
    ({"content": "x", "user_id": "alice", "occurred_at": "2999-01-01T00:00:00Z"}, "occurred_at"),
    ({"content": "x", "user_id": "alice", "colour": "red"}, "colour"),
])
def test_invalid_bodies_are_422_with_field_and_reason(admin, database: Database, body: dict, field: str) -> None:  # noqa: ANN001
    response = admin.post("/api/memories/", json=body)
    assert response.status_code == 422
    answer = response.json()
    assert answer["errors"][0]["field"] == field
    assert answer["detail"].startswith(f"{field}: ") and "\n" not in answer["detail"]
    assert "Traceback" not in response.text
    with database.connection() as conn:
        assert conn.execute("SELECT count(*) FROM memories").fetchone()[0] == 0


def test_malformed_json_and_bad_ids_are_422(admin) -> None:  # noqa: ANN001
    broken = admin.post("/api/memories/", content=b'{"content": ', headers={"content-type": "application/json"})
    assert broken.status_code == 422 and broken.json()["detail"].startswith("body: invalid JSON")
    bad_id = admin.get("/api/memories/not-a-uuid")
    assert bad_id.status_code == 422 and bad_id.json()["errors"][0]["field"] == "memory_id"
    bad_query = admin.get("/api/memories", params={"limit": 0})
    assert bad_query.status_code == 422 and bad_query.json()["errors"][0]["field"] == "limit"


def test_unknown_ids_and_routes_are_404(admin) -> None:  # noqa: ANN001
    missing = uuid.uuid4()
    for method, path in [("GET", f"/api/memories/{missing}"), ("DELETE", f"/api/memories/{missing}"),
                         ("GET", f"/api/distillations/{missing}"), ("GET", f"/api/warmth/{missing}"),
                         ("POST", f"/api/review/{missing}/approve"), ("POST", f"/api/conflicts/{missing}/resolve"),
                         ("GET", "/api/nothing-here")]:
        response = admin.request(method, path)
        assert response.status_code == 404, (method, path)
        assert response.json()["detail"]


def test_bodies_over_one_mebibyte_are_413(admin, database: Database) -> None:  # noqa: ANN001
    big = {"content": "User: " + "x" * (1024 * 1024) + "\nAssistant: ok", "user_id": "alice"}
    response = admin.post("/api/memories/", json=big)
    assert response.status_code == 413
    # The API's JSON error shape, naming the limit (not Starlette's plain "Content Too Large").
    assert response.headers["content-type"] == "application/json"
    assert "larger than the limit of 1 MiB (1048576 bytes)" in response.json()["detail"]
    with database.connection() as conn:
        assert conn.execute("SELECT count(*) FROM memories").fetchone()[0] == 0
    # Just under the limit is fine.
    fits = admin.post("/api/memories/", json={"content": "User: " + "y" * 150_000 + "\nAssistant: ok",
                                              "user_id": "alice"})
    assert fits.status_code == 201


def test_a_chunked_body_over_the_limit_is_a_json_413_too(admin, database: Database) -> None:  # noqa: ANN001
    # No Content-Length: the body is counted as it arrives and refused once past the limit.
    def chunks():  # noqa: ANN202
        yield b'{"user_id": "alice", "content": "User: '
        for _ in range(300):
            yield b"x" * 4096
        yield b'\\nAssistant: ok"}'

    response = admin.post("/api/memories/", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert response.json()["detail"] == "request body is larger than the limit of 1 MiB (1048576 bytes)"
    with database.connection() as conn:
        assert conn.execute("SELECT count(*) FROM memories").fetchone()[0] == 0


def test_every_route_but_health_needs_a_valid_key(app) -> None:  # noqa: ANN001
    anonymous = client_with(app, None)
    wrong = client_with(app, ADMIN_KEY + "x")
    assert anonymous.get("/health").status_code == 200
    for client, detail in ((anonymous, "missing X-API-Key header"), (wrong, "invalid or revoked API key")):
        for method, path in [("GET", "/api/memories"), ("POST", "/api/memories/"), ("GET", "/metrics"),
                             ("GET", "/api/queue"), ("POST", "/api/distillations/search"), ("POST", "/api/forget")]:
            response = client.request(method, path, json={})
            assert response.status_code == 401, (method, path)
            assert response.json()["detail"] == detail
