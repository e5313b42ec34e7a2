"""Secrets (issue 6 §7): API keys are stored hashed; webhook URLs, keys and the database password
never appear in logs, metrics, error messages or Dagster run storage.

Each secret is a distinctive string; the tests provoke the paths that could leak one (an LLM
endpoint that echoes the key in its error body, a webhook that answers 500, failed runs, 401s,
502s, metrics, health) and then grep everything that was captured: the ``yak serve`` output, every
HTTP answer, the log records of an in-process pipeline run, every file of an on-disk Dagster
instance, and every row of every table.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import dagster as dg
import httpx
import pytest

from yak_loopback.openai_replies import Reply
from yak_loopback.openai_server import FakeOpenAIServer
from yak_pipeline.defs.resources import default_resources
from yak_pipeline.settings import get_settings
from yak_pipeline.store.database import Database, connect
from yak_pipeline.store.memories import insert_memory, new_exchange
from yak_pipeline_tests.api_fixtures import rows_mentioning
from yak_pipeline_tests.pipeline_helpers import DAY, MEMORY_ASSETS, at
from yak_pipeline_tests.reliability_helpers import (
    WebhookReceiver,
    forget_shared_pool,
    report_figure,
    yak_env,
    yak_serve,
)
from yak_pipeline_tests.store_helpers import seed_memory_with_distillation

ADMIN_KEY = "adm-SECRET-7f3e9a1c-admin-key"
LLM_KEY = "sk-SECRET-4b8d2e6f-llm-key"
HOOK_TOKEN = "SECRET-HOOK-9c1a5e7b"
DB_PASSWORD = "SECRETPW3d7f1b9e"


def _with_password(url: str) -> str:
    """The test database URL with a password in it (the embedded server trusts local sockets, so it is accepted)."""
    assert "postgres:@" in url, url
    return url.replace("postgres:@", f"postgres:{DB_PASSWORD}@", 1)


def _leaks(text: str, secrets: list[str]) -> list[str]:
    return [s for s in secrets if s in text]


def test_keys_are_stored_hashed_and_no_secret_reaches_api_answers_or_logs(db_url: str, database: Database,
                                                                         tmp_path: Path) -> None:
    with WebhookReceiver(status=500) as webhook, FakeOpenAIServer() as llm:
        # An endpoint that echoes the caller's key in its error body, as some proxies do.
        llm.script(*[Reply.status(500, {"error": {"message": f"upstream refused key {LLM_KEY}"}})] * 10)
        env = yak_env(_with_password(db_url), tmp_path / "home", YAK_ADMIN_API_KEY=ADMIN_KEY,
                      YAK_LLM_BASE_URL=llm.base_url, YAK_LLM_API_KEY=LLM_KEY, YAK_LLM_MAX_RETRIES="0",
                      YAK_ERROR_WEBHOOK=webhook.url(f"/hook/{HOOK_TOKEN}/error"),
                      YAK_CRITICAL_WEBHOOK=webhook.url(f"/hook/{HOOK_TOKEN}/critical"))
        answers: list[str] = []
        with yak_serve(env, tmp_path) as server:
            with httpx.Client(base_url=server.url, timeout=60) as client:
                def call(method: str, path: str, key: str | None = ADMIN_KEY, **kwargs: object) -> httpx.Response:
                    response = client.request(method, path, headers={"X-API-Key": key} if key else {}, **kwargs)
                    answers.append(f"{response.status_code} {response.headers} {response.text}")
                    return response

                created = call("POST", "/api/keys", json={"user_id": "alice", "label": "phone"})
                assert created.status_code == 201
                user_key = created.json()["key"]
                call("POST", "/api/memories/", key=user_key, json={"user_id": "alice",
                                                                   "content": "User: My PIN is 4321.\nAssistant: Noted."})
                with database.connection() as conn:
                    _, distillation = seed_memory_with_distillation(
                        conn, user_id="alice", exchange="User: I like tea.\nAssistant: ok",
                        distillation="The user likes tea.")
                # The evaluator's endpoint fails and echoes the key: the 502 says why, without it.
                evaluated = call("POST", "/api/warmth/evaluate", key=user_key, json={
                    "memory_id": str(distillation), "context": "User: tea?\nAssistant: yes"})
                assert evaluated.status_code == 502 and "HTTP 500" in evaluated.json()["detail"]
                call("GET", "/api/keys")
                call("GET", "/health", key=None)
                call("GET", "/metrics")
                assert call("GET", "/api/memories", key=ADMIN_KEY + "x").status_code == 401
                assert call("GET", "/api/memories", key=user_key[:-1]).status_code == 401
                call("GET", "/openapi.json", key=None)
            logs = server.logs()

    # Keys: only their SHA-256 is stored, and no table holds any secret in any column.
    with database.connection() as conn:
        stored = conn.execute("SELECT key_hash, prefix FROM api_keys WHERE user_id = 'alice'").fetchone()
        assert stored[0] == hashlib.sha256(user_key.encode()).hexdigest() and user_key.startswith(stored[1])
        for secret in (user_key, ADMIN_KEY, LLM_KEY, HOOK_TOKEN, DB_PASSWORD):
            assert rows_mentioning(conn, secret) == {}, secret
    secrets = [ADMIN_KEY, user_key, LLM_KEY, HOOK_TOKEN, DB_PASSWORD]
    assert _leaks(logs, secrets) == []
    # The one answer that must hold a key is the one that creates it.
    assert [a for a in answers if _leaks(a, secrets)] == [answers[0]] and _leaks(answers[0], secrets) == [user_key]
    report_figure("Secrets (API)", f"{len(answers)} answers and {len(logs.splitlines())} log lines of yak serve: "
                  "0 secrets (admin key, user key, LLM key, webhook token, DB password); api_keys holds SHA-256 "
                  "only; 0 table rows contain a secret")


def test_no_secret_reaches_pipeline_logs_alerts_errors_or_dagster_run_storage(
        db_url: str, database: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    with database.connection() as conn:
        for i in range(3):
            insert_memory(conn, new_exchange(user_id="alice", content=f"User: I have {i} dogs.\nAssistant: Nice.", source="api",
                                             occurred_at=at(DAY, 12, i)))
    with WebhookReceiver(status=500) as webhook, FakeOpenAIServer() as llm:
        llm.script(*[Reply.status(500, {"error": {"message": f"upstream refused key {LLM_KEY}"}})] * 10)
        for name, value in {"YAK_DATABASE_URL": _with_password(db_url), "YAK_EMBEDDER": "hashing",
                            "YAK_LLM_BASE_URL": llm.base_url, "YAK_LLM_API_KEY": LLM_KEY, "YAK_LLM_MAX_RETRIES": "0",
                            "YAK_ERROR_WEBHOOK": webhook.url(f"/hook/{HOOK_TOKEN}/error"),
                            "YAK_CRITICAL_WEBHOOK": webhook.url(f"/hook/{HOOK_TOKEN}/critical")}.items():
            monkeypatch.setenv(name, value)
        get_settings.cache_clear()
        dagster_home = tmp_path / "dagster-home"
        dagster_home.mkdir()
        caplog.set_level(logging.DEBUG)
        try:
            with dg.DagsterInstance.local_temp(str(dagster_home)) as instance:
                from yak_pipeline.defs.partitions import add_missing_partitions, day_tags

                add_missing_partitions(instance, [("alice", DAY)])

                result = dg.materialize(MEMORY_ASSETS, resources=default_resources(get_settings()), instance=instance,
                                        partition_key="alice", tags=day_tags([DAY]), raise_on_error=False)
                records = instance.get_records_for_run(result.run_id).records
                stored_events = "\n".join(repr(r.event_log_entry) for r in records)
                run_config = repr(instance.get_run_by_id(result.run_id).run_config)
        finally:
            forget_shared_pool(_with_password(db_url))
            get_settings.cache_clear()
        assert webhook.count("distillation_failed") == 1  # the alert was sent (and its webhook answered 500)
    assert result.success  # the failures are recorded on the memories, not a crash
    with connect(db_url) as conn:
        errors = [r[0] for r in conn.execute("SELECT last_error FROM memories").fetchall()]
        for secret in (LLM_KEY, HOOK_TOKEN, DB_PASSWORD):
            assert rows_mentioning(conn, secret) == {}, secret
    assert all(e and "HTTP 500" in e for e in errors) and all("***" in e for e in errors)  # redacted, not dropped
    captured = capfd.readouterr()
    logged = "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    on_disk = b"".join(p.read_bytes() for p in dagster_home.rglob("*") if p.is_file())
    secrets = [LLM_KEY, HOOK_TOKEN, DB_PASSWORD]
    assert "alert webhook failed" in logged  # the paths that could have printed the URL did run …
    assert "HTTP Request: POST <webhook URL>" in logged  # … httpx's own request log among them
    for where, text in {"log records": logged, "stdout/stderr": captured.out + captured.err,
                        "stored events": stored_events, "run config": run_config,
                        "webhook bodies": repr([p.body for p in webhook.posts])}.items():
        assert _leaks(text, secrets) == [], where
    assert [s for s in secrets if s.encode() in on_disk] == []
    report_figure("Secrets (pipeline)", f"failed run with an LLM echoing its key and a webhook answering 500: "
                  f"{len(caplog.records)} log records, {len(records)} stored Dagster events, run config, "
                  f"{len(on_disk) // 1024} KiB of Dagster storage, {len(errors)} memory errors, alert bodies: "
                  "0 secrets (key redacted as ***)")
