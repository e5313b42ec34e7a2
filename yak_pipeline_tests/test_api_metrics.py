"""``/metrics``: the ten metrics of DESIGN §6 and issue 13's four, parseable, counting every process's work."""

from __future__ import annotations

import math
import threading
import time

import psycopg
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from yak_pipeline.api.app import create_app
from yak_pipeline.api.metrics import MetricsBuffer
from yak_pipeline.core.metric_catalogue import METRICS
from yak_pipeline.embeddings.hashing import HashingEmbedder
from yak_pipeline.llm import RulesProvider
from yak_pipeline.services.distill import DistillJob, distill_memories
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline.store.memories import record_memory_error
from yak_pipeline.store.metrics import (
    counter_event,
    read_metrics,
    record_distillation_latency,
    record_error,
)
from yak_pipeline.store.turns import mark_turn
from yak_pipeline_tests.api_fixtures import (  # noqa: F401
    ADMIN_KEY,
    Seeded,
    admin,
    api_settings,
    app,
    client_with,
    seeded,
)

DESIGN_NAMES = ("yak_requests_total", "yak_distillations_created", "yak_distillations_versioned",
                "yak_memories_deleted", "yak_recall_latency_ms", "yak_distillation_latency_ms", "yak_queue_size",
                "yak_warmth_updates", "yak_conflicts_detected", "yak_errors_total")
PROXY_NAMES = ("yak_proxy_requests_total", "yak_proxy_memories_injected", "yak_proxy_degradations_total",
               "yak_mcp_tool_calls_total")
TRUST_NAMES = ("yak_secrets_redacted_total",)  # issue 35
ALL_NAMES = DESIGN_NAMES + PROXY_NAMES + TRUST_NAMES
TYPES = {"yak_recall_latency_ms": "histogram", "yak_distillation_latency_ms": "histogram", "yak_queue_size": "gauge"}


def scrape(client) -> dict[str, dict]:  # noqa: ANN001
    """Families by their DESIGN name: type and samples ``{(name, labels): value}``."""
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    families = {}
    for family in text_string_to_metric_families(response.text):
        name = next(n for n in ALL_NAMES if n.removesuffix("_total") == family.name.removesuffix("_total"))
        families[name] = {"type": family.type, "samples": {
            (s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}}
    return families


def total(family: dict, suffix: str = "") -> float:
    """Sum of a family's samples whose name ends with ``suffix`` (e.g. ``_count``)."""
    return sum(v for (name, _), v in family["samples"].items() if name.endswith(suffix))


def test_exactly_the_ten_metrics_issue_13s_four_and_issue_35s_one_with_their_types(admin) -> None:  # noqa: ANN001
    assert [m.name for m in METRICS] == list(ALL_NAMES)
    families = scrape(admin)
    assert set(families) == set(ALL_NAMES)
    for name, family in families.items():
        assert family["type"] == TYPES.get(name, "counter"), name
    text = admin.get("/metrics").text
    for name in ALL_NAMES:
        assert name in text


def test_a_fresh_server_exposes_every_family_with_a_series_at_zero(admin) -> None:  # noqa: ANN001
    # Nothing has happened yet: each family still has samples, so Prometheus never sees one as
    # absent (dashboards and absent() alerts work from the first scrape).
    families = scrape(admin)
    for name in DESIGN_NAMES:
        assert families[name]["samples"], f"{name} has no series on a fresh server"
    versioned = families["yak_distillations_versioned"]["samples"]
    assert versioned[("yak_distillations_versioned_total", (("reason", "merged"),))] == 0
    warmth = families["yak_warmth_updates"]["samples"]
    assert {labels for _, labels in warmth} >= {(("reason", r),) for r in ("turn", "nightly", "manual", "reset")}
    assert total(families["yak_warmth_updates"]) == 0


def test_every_metric_counts_work_done_by_the_api_and_the_pipeline(  # noqa: PLR0915
    admin, seeded: Seeded, database: Database  # noqa: ANN001
) -> None:
    # API work: requests, recall, a merge (a version), a forget, a turn.
    admin.post("/api/distillations/search", json={"query": "locker", "user_id": "alice", "threshold": 0.1})
    admin.post("/api/context", json={"query": "locker", "user_id": "bob", "threshold": 0.1})
    admin.post("/api/distillations/merge", json={"keep_id": seeded.bob.distillation_id,
                                                 "merge_id": seeded.bob.other_distillation_id, "content": "Merged."})
    admin.post("/api/forget", json={"command": f"/forget {seeded.alice.memory_id}", "user_id": "alice"})
    admin.post("/api/turns", json={"user_id": "alice", "user_message": "hi", "assistant_message": "hello"})
    # Pipeline work, as a pipeline run records it: a distillation, a failed attempt, a latency.
    pending = admin.post("/api/memories/", json={"content": "User: I run marathons.\nAssistant: Impressive!",
                                                 "user_id": "alice"}).json()["id"]
    distill_memories(DistillJob(database, llm=RulesProvider(), embedder=HashingEmbedder(384), prompt_version="v1"),
                     [pending])
    with database.connection() as conn:
        record_memory_error(conn, seeded.bob.memory_id, "LLM timed out")
        mark_turn(conn, seeded.bob.turn_id, status="pending", error="evaluator down")
        record_distillation_latency(conn, 1234.5)
        record_error(conn, "embedding_failed")

    families = scrape(admin)
    for name in DESIGN_NAMES:
        if name == "yak_queue_size":
            continue
        assert total(families[name], "_count" if name in TYPES else "") > 0, name
    assert total(families["yak_distillations_created"]) == 7  # 6 seeded + 1 distilled
    assert total(families["yak_distillations_versioned"]) == 1
    assert total(families["yak_memories_deleted"]) == 1
    assert total(families["yak_conflicts_detected"]) == 2
    assert total(families["yak_warmth_updates"]) == 2
    assert total(families["yak_recall_latency_ms"], "_count") == 2
    # Two observations: the distillation run above recorded its own, plus the explicit 1234.5 ms.
    latency = families["yak_distillation_latency_ms"]["samples"]
    assert latency[("yak_distillation_latency_ms_count", ())] == 2
    fast = latency[("yak_distillation_latency_ms_sum", ())] - 1234.5
    assert 0 < fast < 1000  # the offline rules + hashing distillation of one exchange
    assert latency[("yak_distillation_latency_ms_bucket", (("le", "2500.0"),))] == 2
    assert latency[("yak_distillation_latency_ms_bucket", (("le", "1000.0"),))] == 1
    errors = {dict(labels)["type"]: v for (_, labels), v in families["yak_errors_total"]["samples"].items()}
    assert errors["distillation_failed"] == 1 and errors["warmth_failed"] == 1 and errors["embedding_failed"] == 1
    queue = {dict(labels)["queue"]: v for (_, labels), v in families["yak_queue_size"]["samples"].items()}
    assert queue == {"memories": 1.0, "turns": 2.0}  # the turn's exchange; bob's turn and the new one
    requests = families["yak_requests_total"]["samples"]
    assert requests[("yak_requests_total", (("method", "POST"), ("route", "/api/distillations/search"),
                                            ("status", "200")))] == 1
    assert requests[("yak_requests_total", (("method", "POST"), ("route", "/api/memories"), ("status", "201")))] == 1


def test_counters_never_go_down_after_a_forget(admin, seeded: Seeded) -> None:  # noqa: ANN001
    before = scrape(admin)
    admin.delete(f"/api/memories/{seeded.bob.memory_id}")
    after = scrape(admin)
    for name in ("yak_distillations_created", "yak_conflicts_detected", "yak_warmth_updates"):
        assert total(after[name]) == total(before[name]), name
    assert total(after["yak_memories_deleted"]) == total(before["yak_memories_deleted"]) + 1


def test_counts_from_another_process_show_in_this_scrape(api_settings: Settings, database: Database) -> None:
    """Two apps stand for two API workers: what one counted, the other's scrape reports."""
    worker = create_app(api_settings, database=database)
    other = create_app(api_settings, database=database)
    client_with(worker, ADMIN_KEY).post("/api/distillations/search", json={"query": "x", "user_id": "alice"})
    worker.state.services.metrics.flush(database)  # what the worker does every few seconds and at shutdown
    families = scrape(client_with(other, ADMIN_KEY))
    assert total(families["yak_recall_latency_ms"], "_count") == 1
    with database.connection() as conn:
        assert conn.execute("SELECT count(*) FROM metric_events").fetchone()[0] == 0  # folded into the totals
        totals = read_metrics(conn, queue_sizes={})
    assert totals.histograms["yak_recall_latency_ms"][()].count == 1
    assert not math.isnan(totals.histograms["yak_recall_latency_ms"][()].sum)


def test_a_flush_returns_only_when_every_event_counted_before_it_is_written(database: Database, db_url: str) -> None:
    """A scrape flushes, then reads the database. When the request middleware's flush (run after a
    response, every few seconds) has taken the events and is still writing them, the scrape's
    flush must wait for it; otherwise the scrape misses events counted before it (the proxy
    test's sample that was sometimes missing). The middleware's write is held here by a lock on
    the events table, so the order is the same on every run."""
    buffer = MetricsBuffer()
    buffer.count_error("flush_race")
    with psycopg.connect(db_url) as holder, psycopg.connect(db_url, autocommit=True) as watcher:
        holder.execute("LOCK TABLE metric_events IN EXCLUSIVE MODE")
        middleware = threading.Thread(target=buffer.flush, args=(database,))
        middleware.start()
        # The middleware's flush has taken the event once its INSERT waits for the lock (watched
        # outside the holder's transaction, whose view of pg_stat_activity stays as it first read it).
        deadline = time.monotonic() + 10
        while not watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE 'INSERT INTO metric_events%'").fetchone()[0]:
            assert time.monotonic() < deadline, "the middleware's flush never reached its INSERT"
            time.sleep(0.02)
        scrape = threading.Thread(target=buffer.flush, args=(database,))
        scrape.start()
        scrape.join(timeout=1.0)
        assert scrape.is_alive(), "the scrape's flush returned while the event it must see was still being written"
        holder.commit()  # the middleware's write goes through, then the scrape's flush returns
    middleware.join(timeout=10)
    scrape.join(timeout=10)
    assert not middleware.is_alive() and not scrape.is_alive()
    with database.connection() as conn:
        assert read_metrics(conn, queue_sizes={}).counters["yak_errors_total"][(("type", "flush_race"),)] == 1


def test_an_app_that_serves_no_one_counts_requests_but_not_recall_latency(api_settings: Settings,
                                                                         database: Database) -> None:
    """The in-process CLI's app (``served=False``): its first recall loads the model, a cold start."""
    cli_app = create_app(api_settings, database=database, served=False)
    client_with(cli_app, ADMIN_KEY).post("/api/distillations/search", json={"query": "x", "user_id": "alice"})
    cli_app.state.services.metrics.flush(database)
    families = scrape(client_with(create_app(api_settings, database=database), ADMIN_KEY))
    assert total(families["yak_recall_latency_ms"], "_count") == 0
    searches = [v for (_, labels), v in families["yak_requests_total"]["samples"].items()
                if dict(labels).get("route") == "/api/distillations/search"]
    assert sum(searches) == 1


def test_metrics_need_an_admin_key(app, seeded: Seeded) -> None:  # noqa: ANN001
    response = client_with(app, seeded.alice_key).get("/metrics")
    assert response.status_code == 403 and response.json()["detail"] == "this route needs an admin API key"


def test_bad_metric_values_are_refused(database: Database) -> None:
    with database.connection() as conn:
        for bad in (-1.0, math.nan, math.inf):
            with pytest.raises(ValueError, match="finite number"):
                record_distillation_latency(conn, bad)
        with pytest.raises(ValueError, match="not one of Yak's"):
            counter_event("yak_made_up_total")


def test_openmetrics_when_the_scraper_asks(admin) -> None:  # noqa: ANN001
    response = admin.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.endswith("# EOF\n")
    assert len(list(parse_openmetrics(response.text))) == len(ALL_NAMES)
    assert admin.get("/metrics").headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
