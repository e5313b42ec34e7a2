"""Health, the queue, database outages (503 + alert), queue overflow, API keys and the OpenAPI document."""

from __future__ import annotations

import socket

import pytest
from pydantic import SecretStr

from yak_loopback.openai_server import FakeOpenAIServer
from yak_pipeline.api.app import create_app
from yak_pipeline.services import queue_watch
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline_tests.api_fixtures import ADMIN_KEY, admin, api_settings, app, client_with  # noqa: F401


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _webhooks(server: FakeOpenAIServer) -> dict:
    return {"error_webhook": SecretStr(f"http://127.0.0.1:{server.port}/webhook/error"),
            "critical_webhook": SecretStr(f"http://127.0.0.1:{server.port}/webhook/critical")}


def test_health_reports_each_dependency(app) -> None:  # noqa: ANN001
    response = client_with(app, None).get("/health")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["database"] == {"ok": True, "detail": "reachable"}
    assert body["embedder"]["detail"] == "feature-hashing-384 (384 dimensions)"
    assert body["llm"]["ok"] and "rules provider" in body["llm"]["detail"]


def test_health_probes_an_openai_compatible_llm(api_settings: Settings, database: Database,
                                                openai_server: FakeOpenAIServer) -> None:
    settings = api_settings.model_copy(update={"llm_base_url": openai_server.base_url, "llm_model": "fake-model"})
    body = client_with(create_app(settings, database=database), None).get("/health").json()
    assert body["llm"] == {"ok": True, "detail": "reachable (fake-model)"}
    assert [(r.method, r.path) for r in openai_server.requests] == [("GET", "/v1/models")]
    openai_server.stop()
    down = client_with(create_app(settings, database=database), None).get("/health")
    assert down.status_code == 200 and down.json()["status"] == "degraded" and not down.json()["llm"]["ok"]


def test_database_outage_is_503_with_retry_after_and_one_alert(tmp_path, openai_server: FakeOpenAIServer) -> None:  # noqa: ANN001
    settings = Settings(home=tmp_path / "home", database_url=f"postgresql://yak@127.0.0.1:{_closed_port()}/yak",
                        embedder="hashing", admin_api_key=SecretStr(ADMIN_KEY), **_webhooks(openai_server))
    app = create_app(settings)
    admin = client_with(app, ADMIN_KEY)
    for _ in range(3):
        response = admin.get("/api/memories")
        assert response.status_code == 503
        assert response.headers["retry-after"] == "5"
        assert response.json() == {"detail": "the database is unavailable; try again shortly"}
    user_key = client_with(app, "yak_some-user-key").get("/api/memories")
    assert user_key.status_code == 503  # the key cannot be checked either
    health = client_with(app, None).get("/health")
    assert health.status_code == 503 and health.headers["retry-after"] == "5"
    assert health.json()["database"]["ok"] is False and health.json()["status"] == "degraded"
    posted = [(r.path, r.body["embeds"][0]["title"]) for r in openai_server.requests]
    # Critical: both webhooks, once for all those failures (de-duplicated).
    assert posted == [("/webhook/error", "db_connection_lost (critical)"),
                      ("/webhook/critical", "db_connection_lost (critical)")]
    assert "cannot connect" in openai_server.requests[0].body["embeds"][0]["fields"][2]["value"]


def test_queue_and_its_overflow_alert(api_settings: Settings, database: Database, openai_server: FakeOpenAIServer,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue_watch, "QUEUE_OVERFLOW_THRESHOLD", 2)
    app = create_app(api_settings.model_copy(update=_webhooks(openai_server)), database=database)
    admin = client_with(app, ADMIN_KEY)
    for i in range(2):
        admin.post("/api/memories/", json={"content": f"User: note {i}\nAssistant: ok", "user_id": "alice"})
    with database.connection() as conn:
        conn.execute("UPDATE memories SET status = 'failed', last_error = 'gave up', attempts = 5 "
                     "WHERE content LIKE '%%note 0%%'")
    queue = admin.get("/api/queue").json()
    assert (queue["pending_memories"], queue["failed_memories"], queue["pending_turns"]) == (1, 1, 0)
    assert queue["failed"][0]["kind"] == "memory" and queue["failed"][0]["last_error"] == "gave up"
    assert openai_server.requests == []
    admin.post("/api/turns", json={"user_id": "bob", "user_message": "a", "assistant_message": "b"})
    admin.post("/api/memories/", json={"content": "User: one more\nAssistant: ok", "user_id": "alice"})
    admin.get("/api/queue")
    admin.get("/metrics")
    alerts = [r.body["embeds"][0]["title"] for r in openai_server.requests]
    assert alerts == ["queue_overflow (error)"]


def test_api_keys_lifecycle(admin, app, database: Database) -> None:  # noqa: ANN001
    created = admin.post("/api/keys", json={"user_id": "carol", "label": "phone"})
    assert created.status_code == 201
    key = created.json()["key"]
    assert key.startswith("yak_") and created.json()["prefix"] == key[:10] and created.json()["admin"] is False
    with database.connection() as conn:
        stored = conn.execute("SELECT key_hash, prefix FROM api_keys").fetchall()
    assert all(key not in row[0] for row in stored)

    carol = client_with(app, key)
    assert carol.post("/api/memories/", json={"content": "User: hi\nAssistant: hi", "user_id": "carol"}).status_code == 201
    assert carol.post("/api/keys", json={"admin": True}).status_code == 403
    listed = admin.get("/api/keys").json()
    assert [k["prefix"] for k in listed] == [key[:10]] and "key" not in listed[0]

    assert admin.delete(f"/api/keys/{created.json()['id']}").json()["revoked_at"] is not None
    assert carol.get("/api/memories").status_code == 401
    assert admin.delete(f"/api/keys/{created.json()['id']}").status_code == 404
    for bad in ({"user_id": "carol", "admin": True}, {}, {"user_id": "no spaces"}):
        assert admin.post("/api/keys", json=bad).status_code == 422


def test_openapi_documents_every_route(app) -> None:  # noqa: ANN001
    spec = client_with(app, None).get("/openapi.json").json()
    assert spec["components"]["securitySchemes"]["APIKeyHeader"]["name"] == "X-API-Key"
    expected = {
        ("post", "/api/memories/"), ("get", "/api/memories"), ("get", "/api/memories/{memory_id}"),
        ("delete", "/api/memories/{memory_id}"), ("post", "/api/distillations/search"), ("post", "/api/context"),
        ("post", "/api/turns"), ("post", "/api/warmth/evaluate"), ("get", "/api/warmth/{memory_id}"),
        ("post", "/api/warmth/{memory_id}/reset"), ("post", "/api/warmth/bulk-reset"),
        ("get", "/api/distillations"), ("get", "/api/distillations/{distillation_id}"),
        ("post", "/api/distillations/{distillation_id}/versions"), ("post", "/api/distillations/merge"),
        ("post", "/api/distillations/{distillation_id}/re-embed"), ("get", "/api/review"),
        ("post", "/api/review/{distillation_id}/approve"), ("post", "/api/review/{distillation_id}/reject"),
        ("get", "/api/conflicts"), ("post", "/api/conflicts/{conflict_id}/resolve"),
        ("post", "/api/conflicts/{conflict_id}/dismiss"), ("post", "/api/forget"), ("post", "/api/forget/confirm"),
        ("get", "/health"), ("get", "/api/queue"), ("get", "/metrics"),
    }
    operations = {(method, path): op for path, item in spec["paths"].items() for method, op in item.items()}
    assert expected <= set(operations)
    for key, operation in operations.items():
        assert operation.get("description"), key
    assert "security" not in operations[("get", "/health")]
    assert operations[("get", "/api/queue")]["security"] == [{"APIKeyHeader": []}]
