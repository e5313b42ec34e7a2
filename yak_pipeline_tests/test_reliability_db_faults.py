"""Database faults (issue 6 §2): PostgreSQL stopped during a materialization and during API writes.

The run fails cleanly, the API answers 503 with ``Retry-After``, one ``db_connection_lost`` alert
reaches the webhooks, and after a restart the work completes with no memory, distillation or
version stored twice. The database is a private embedded server of this module, stopped and
started for real (a fast shutdown cuts every open connection), never the shared session server.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dagster as dg
import httpx
import psycopg
import pytest

from yak_loopback.openai_replies import Reply
from yak_loopback.openai_server import FakeOpenAIServer
from yak_pipeline.defs.resources import AlertsResource
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline_tests.pipeline_helpers import (
    DAY,
    materialization_metadata,
    new_instance,
    pipeline_resources,
    run_partition,
)
from yak_pipeline_tests.reliability_helpers import (
    DISTIL_ASSETS,
    PrivatePostgres,
    WebhookReceiver,
    add_facts,
    forget_shared_pool,
    pipeline_state,
    report_figure,
    wait_until,
    yak_env,
    yak_serve,
)

ADMIN_KEY = "reliability-admin-key-0123456789"


@pytest.fixture(scope="module")
def private_pg() -> Iterator[PrivatePostgres]:
    """This module's own PostgreSQL server, which its tests stop and start."""
    server = PrivatePostgres()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def private_db(private_pg: PrivatePostgres) -> Iterator[str]:
    """A fresh migrated database on the private server; the server is running again afterwards."""
    url = private_pg.create_database(f"yak_{uuid.uuid4().hex[:10]}")
    yield url
    if not private_pg.running:
        private_pg.start()
    forget_shared_pool(url)


@pytest.fixture
def webhook() -> Iterator[WebhookReceiver]:
    with WebhookReceiver() as receiver:
        yield receiver


def _count(url: str, sql: str) -> int:
    with psycopg.connect(url, connect_timeout=3) as conn:
        return conn.execute(sql).fetchone()[0]


def test_database_lost_mid_run_fails_the_run_cleanly_alerts_once_and_the_rerun_completes(
        private_pg: PrivatePostgres, private_db: str, tmp_path: Path, webhook: WebhookReceiver) -> None:
    n = 40
    settings = Settings(home=tmp_path / "home", database_url=private_db, embedder="hashing")
    with Database(private_db, max_size=2) as db:
        add_facts(db, n)
    with FakeOpenAIServer() as server:
        # Slow answers, so the run is still distilling when the database goes away.
        server.script(*[Reply.delay(0.15)] * n)
        resources = pipeline_resources(settings, llm_base_url=server.base_url, concurrency=2)
        resources["alerts"] = AlertsResource.from_settings(settings, resources["postgres"],
                                                           error_webhook=webhook.url("/hook/error"),
                                                           critical_webhook=webhook.url("/hook/critical"))
        instance = new_instance("alice")
        outcome: dict[str, dg.ExecuteInProcessResult] = {}
        worker = threading.Thread(target=lambda: outcome.setdefault(
            "run", run_partition(instance, resources, "alice", DAY, DISTIL_ASSETS)), daemon=True)
        worker.start()
        wait_until(lambda: _count(private_db, "SELECT count(*) FROM distillations") >= 8, timeout=60,
                   what="the run to distil some memories")
        private_pg.stop()
        worker.join(timeout=90)

        assert not worker.is_alive()

        failed = outcome["run"]
        assert not failed.success  # the run fails, it does not hang or pretend
        failures = [e for e in failed.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
        assert [e.step_key for e in failures] == ["distillations"]  # the check after it never ran
        error = failures[0].event_specific_data.error
        causes = []
        while error is not None:
            causes.append(f"{error.cls_name}: {error.message.strip()}")
            error = error.cause
        assert any(c.startswith("DatabaseUnavailable: ") for c in causes), causes
        assert webhook.count("db_connection_lost", "/hook/error") == 1
        assert webhook.count("db_connection_lost", "/hook/critical") == 1

        private_pg.start()
        with psycopg.connect(private_db) as conn:
            half = pipeline_state(conn)
        assert half.violations == []  # nothing half-written when the connections were cut
        assert 8 <= half.distillations < n and half.distilled == half.distillations
        assert half.pending == n - half.distilled

        rerun = run_partition(instance, resources, "alice", DAY, DISTIL_ASSETS)

        assert rerun.success
        assert materialization_metadata(rerun, "distillations")["rows_out"] == n - half.distilled
        with psycopg.connect(private_db) as conn:
            done = pipeline_state(conn)
            distilled_versions = conn.execute(
                "SELECT count(*) FROM distillation_versions WHERE reason = 'distilled'").fetchone()[0]
        assert done.violations == []
        assert (done.memories, done.distilled, done.distillations, distilled_versions) == (n, n, n, n)
        assert webhook.count("db_connection_lost") == 2  # still the one alert, on both webhooks
    report_figure("PostgreSQL stopped mid-run", f"run failed cleanly with {half.distilled} of {n} committed, "
                  f"0 half-written, re-run distilled the other {n - half.distilled}: {n} memories, {n} distillations, "
                  f"{n} first versions, 0 duplicates, 1 db_connection_lost alert")


def test_api_writes_during_an_outage_get_503_with_retry_after_and_nothing_is_stored_twice(
        private_pg: PrivatePostgres, private_db: str, tmp_path: Path, webhook: WebhookReceiver) -> None:
    n, clients = 120, 4
    env = yak_env(private_db, tmp_path / "home", YAK_ADMIN_API_KEY=ADMIN_KEY,
                  YAK_ERROR_WEBHOOK=webhook.url("/hook/error"), YAK_CRITICAL_WEBHOOK=webhook.url("/hook/critical"))
    statuses: list[int] = []
    retry_after: list[str | None] = []
    lock = threading.Lock()
    outage_started = threading.Event()

    def post_until_stored(client: httpx.Client, i: int) -> int:
        """A well-behaved client: on 503 wait (bounded) and post the same exchange again."""
        for _ in range(60):
            response = client.post("/api/memories/", json={
                "user_id": "alice", "content": f"User: outage exchange {i}\nAssistant: Noted."})
            with lock:
                statuses.append(response.status_code)
                if response.status_code == 503:
                    retry_after.append(response.headers.get("retry-after"))
            if response.status_code in (200, 201):
                return response.status_code
            assert response.status_code == 503, response.text
            time.sleep(0.5)
        raise AssertionError(f"exchange {i} was never stored")

    with yak_serve(env, tmp_path) as server:
        def client_loop(k: int) -> list[int]:
            with httpx.Client(base_url=server.url, headers={"X-API-Key": ADMIN_KEY}, timeout=60) as client:
                done = []
                for i in range(k, n, clients):
                    if i == n // 3:
                        outage_started.set()
                    done.append(post_until_stored(client, i))
                return done

        with ThreadPoolExecutor(clients) as pool:
            futures = [pool.submit(client_loop, k) for k in range(clients)]
            assert outage_started.wait(60)
            private_pg.stop()
            wait_until(lambda: 503 in statuses, timeout=60, what="a 503 during the outage")
            health = httpx.get(f"{server.url}/health", timeout=30)
            time.sleep(1.0)
            private_pg.start()
            results = [f.result(timeout=300) for f in futures]
        logs = server.logs()

    assert health.status_code == 503 and health.headers["retry-after"] == "5"
    assert sorted(set(statuses)) == [201, 503]  # no 500, no lost request: created, or refused with 503
    assert retry_after and set(retry_after) == {"5"}
    assert sum(len(r) for r in results) == n
    assert _count(private_db, "SELECT count(*) FROM memories") == n
    assert _count(private_db, "SELECT count(DISTINCT content_sha256) FROM memories") == n
    assert _count(private_db, "SELECT count(*) FROM audit_log WHERE action = 'ingest'") == n
    assert webhook.count("db_connection_lost", "/hook/error") == 1
    assert webhook.count("db_connection_lost", "/hook/critical") == 1
    assert "Traceback" not in logs
    report_figure("PostgreSQL stopped during API writes",
                  f"{statuses.count(503)} answers 503 + Retry-After: 5, 0 other 5xx; {n} of {n} exchanges stored "
                  f"once each after the restart; 1 db_connection_lost alert (error + critical webhook)")
