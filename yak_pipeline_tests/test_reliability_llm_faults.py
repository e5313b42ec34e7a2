"""LLM faults (issue 6 §1): whatever the endpoint does, no exchange is lost, nothing invalid is
stored, each error type alerts once per window, and the next run finishes the work.

Real parts only: the Dagster memory job materialized on an ephemeral instance, the test's own
PostgreSQL database, the loopback OpenAI-protocol server driven through the real ``openai``
client, and a loopback webhook receiver counting the alerts that reach it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import dagster as dg
import pytest

from yak_loopback.openai_replies import Reply, rules_replier
from yak_loopback.openai_server import FakeOpenAIServer
from yak_pipeline.defs.distillations.assets import distillations
from yak_pipeline.defs.resources import AlertsResource
from yak_pipeline.defs.scores.assets import warmth
from yak_pipeline.embeddings.hashing import HashingEmbedder
from yak_pipeline.llm.models import DistillationOutput
from yak_pipeline.llm.openai_client import OpenAIChatProvider
from yak_pipeline.llm.prompts import parse_payload
from yak_pipeline.services.distill import DEFAULT_MAX_ATTEMPTS, DistillJob, distill_memories
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline.store.turns import insert_turn
from yak_pipeline_tests.pipeline_helpers import (
    DAY,
    add_exchange,
    at,
    fetch_all,
    fetch_one,
    materialization_metadata,
    new_instance,
    pipeline_env,  # noqa: F401 - fixture
    pipeline_resources,
    run_partition,
)
from yak_pipeline_tests.reliability_helpers import (
    DISTIL_ASSETS,
    WebhookReceiver,
    add_facts,
    fact_text,
    pipeline_state,
    report_figure,
)
from yak_pipeline_tests.store_helpers import seed_memory_with_distillation

pytestmark = pytest.mark.usefixtures("pipeline_env")

MAX_RETRIES = 1  # each distillation makes two requests before it gives up for this run
@pytest.fixture
def webhook() -> Iterator[WebhookReceiver]:
    """A loopback webhook receiver, started and stopped around the test."""
    with WebhookReceiver() as receiver:
        yield receiver


def _resources(settings: Settings, server: FakeOpenAIServer, webhook: WebhookReceiver, *, dedup_seconds: int = 300,
               **llm: Any) -> dict[str, dg.ConfigurableResource]:
    llm = {"max_retries": MAX_RETRIES, "concurrency": 4, **llm}
    resources = pipeline_resources(settings, llm_base_url=server.base_url, **llm)
    resources["alerts"] = AlertsResource.from_settings(settings, resources["postgres"],
                                                       error_webhook=webhook.url("/hook/error"), dedup_seconds=dedup_seconds)
    return resources


def _invalid_distillations(db: Database) -> list[str]:
    """Stored distillations that the strict output model would refuse (there must be none)."""
    bad = []
    for content, confidence, tier, kind in fetch_all(db, "SELECT content, confidence, tier, memory_type FROM distillations"):
        try:
            DistillationOutput.model_validate({"content": content, "confidence": confidence, "tier": tier, "type": kind})
        except ValueError as exc:
            bad.append(f"{content!r}: {exc}")
    return bad


def _state(db: Database):  # noqa: ANN202
    with db.connection() as conn:
        return pipeline_state(conn)


@dataclass(frozen=True)
class Fault:
    """One way the endpoint misbehaves, the reason stored on the memory, and how many exchanges to try."""

    name: str
    reply: Reply
    reason: str
    exchanges: int = 16
    timeout_seconds: float = 2.0


FAULTS = [
    Fault("http-500", Reply.status(500), "HTTP 500", exchanges=100),
    Fault("timeout", Reply.delay(1.0), "no reply", timeout_seconds=0.25),
    Fault("connection-closed", Reply.close(), "cannot reach"),
    Fault("truncated-json", Reply.text('{"content": "User keeps jars of te', finish_reason="length"),
          "reply truncated at the token limit"),
    Fault("not-json", Reply.text("Sure! The user keeps tea in the pantry."), "reply is not JSON"),
    Fault("wrong-shape", Reply.json({"facts": ["User keeps tea."], "certainty": "high"}), "missing field 'content'"),
    Fault("confidence-100", Reply.json({"content": "User keeps tea in the pantry.", "confidence": 100, "tier": "core", "type": "fact"}),
          "confidence 100 is outside [0, 1]"),
    Fault("empty-list", Reply.json([]), "reply is a JSON array"),
    Fault("not-a-completion", Reply.raw({"result": "ok"}), "the response has no choices"),
]


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_llm_fault_loses_nothing_stores_nothing_invalid_alerts_once_and_the_next_run_recovers(
        settings: Settings, database: Database, openai_server: FakeOpenAIServer, webhook: WebhookReceiver,
        fault: Fault) -> None:
    n = fault.exchanges
    memory_ids = add_facts(database, n)
    # The endpoint fails every request of the first run: each exchange is tried twice.
    openai_server.script(*[fault.reply] * (n * (MAX_RETRIES + 1)))
    instance = new_instance("alice")
    resources = _resources(settings, openai_server, webhook, timeout_seconds=fault.timeout_seconds)

    started = time.monotonic()
    failed_run = run_partition(instance, resources, "alice", DAY, DISTIL_ASSETS)

    assert failed_run.success  # a failed distillation is data, not a crashed run
    assert openai_server.pending_replies == 0 and len(openai_server.chat_requests) == n * (MAX_RETRIES + 1)
    meta = materialization_metadata(failed_run, "distillations")
    assert (meta["rows_in"], meta["rows_out"], meta["failed"]) == (n, 0, n)
    rows = fetch_all(database, "SELECT id::text, status, attempts, last_error, content FROM memories")
    assert sorted(r[0] for r in rows) == sorted(memory_ids)  # every exchange is still there …
    assert {(r[1], r[2]) for r in rows} == {("pending", 1)}  # … pending, one attempt counted …
    assert all(fault.reason in r[3] for r in rows), rows[0][3]  # … with the reason recorded
    state = _state(database)
    assert (state.distillations, state.versions) == (0, 0) and state.violations == []
    assert webhook.types() == ["distillation_failed"]  # n failures, one alert
    alert = webhook.posts[0].body
    assert fault.reason.split(" (")[0] in json.dumps(alert)

    # The endpoint recovers (no scripted faults left: it answers like a good model).
    recovered = run_partition(instance, resources, "alice", DAY, DISTIL_ASSETS)

    assert recovered.success
    assert materialization_metadata(recovered, "distillations")["rows_out"] == n
    state = _state(database)
    assert state.violations == []
    assert (state.memories, state.distilled, state.pending, state.distillations) == (n, n, 0, n)
    assert _invalid_distillations(database) == []
    assert webhook.types() == ["distillation_failed"]  # nothing new to say

    calls = len(openai_server.chat_requests)
    again = run_partition(instance, resources, "alice", DAY, DISTIL_ASSETS)
    assert materialization_metadata(again, "distillations")["rows_in"] == 0
    assert len(openai_server.chat_requests) == calls  # nothing distilled twice
    assert _state(database).distillations == n
    report_figure(f"LLM fault {fault.name}",
                  f"{n - state.memories} of {n} exchanges lost, {len(_invalid_distillations(database))} invalid stored, "
                  f"{len(webhook.posts)} alert, all {state.distilled} distilled on the next run "
                  f"({time.monotonic() - started:.1f} s)")


def test_a_slow_endpoint_is_waited_for_and_nothing_fails(settings: Settings, database: Database,
                                                         openai_server: FakeOpenAIServer,
                                                         webhook: WebhookReceiver) -> None:
    n = 8
    add_facts(database, n)
    openai_server.script(*[Reply.delay(1.0)] * n)  # 1 s per answer, within the 5 s timeout
    resources = _resources(settings, openai_server, webhook, timeout_seconds=5.0)

    result = run_partition(new_instance("alice"), resources, "alice", DAY, DISTIL_ASSETS)

    meta = materialization_metadata(result, "distillations")
    assert (meta["rows_out"], meta["failed"]) == (n, 0)
    assert meta["llm_latency_p50_ms"] >= 1000  # it really was slow
    assert len(openai_server.chat_requests) == n  # no retry of a slow but good answer
    state = _state(database)
    assert (state.distilled, state.distillations, state.violations) == (n, n, [])
    assert webhook.posts == []
    report_figure("LLM slow (1 s per answer)", f"0 of {n} lost, 0 retries, 0 alerts, p50 {meta['llm_latency_p50_ms']:.0f} ms")


def test_a_burst_of_500s_shorter_than_the_retries_is_absorbed_within_the_run(
        settings: Settings, database: Database, openai_server: FakeOpenAIServer, webhook: WebhookReceiver) -> None:
    n, retries = 40, 3
    add_facts(database, n)
    # Three failures in a row can hit one exchange at most three times: its fourth attempt succeeds.
    openai_server.script(*[Reply.status(503)] * retries)
    resources = _resources(settings, openai_server, webhook, max_retries=retries)

    result = run_partition(new_instance("alice"), resources, "alice", DAY, DISTIL_ASSETS)

    meta = materialization_metadata(result, "distillations")
    assert (meta["rows_out"], meta["failed"]) == (n, 0)
    assert len(openai_server.chat_requests) == n + retries
    assert _state(database).distillations == n and webhook.posts == []
    report_figure("LLM 503 burst (3 calls) with 3 retries", f"0 of {n} lost, distilled in the same run, 0 alerts")


def test_alerts_are_one_per_type_per_window_across_runs_and_processes(
        settings: Settings, database: Database, openai_server: FakeOpenAIServer, webhook: WebhookReceiver) -> None:
    window = 12  # long enough that a subprocess started on a loaded machine still lands inside it
    add_facts(database, 5)
    with database.connection() as conn:
        memory_id, distillation_id = seed_memory_with_distillation(
            conn, user_id="alice", exchange="User: My locker is 12.\nAssistant: Noted.",
            distillation="The user's locker is number 12.", occurred_at=at(DAY, 5))
        insert_turn(conn, user_id="alice", user_message="Which locker?", assistant_message="Number 12.",
                    recalled_ids=[distillation_id], occurred_at=at(DAY, 5, 1))
    instance = new_instance("alice")
    resources = _resources(settings, openai_server, webhook, dedup_seconds=window, max_retries=0)

    openai_server.script(*[Reply.status(500)] * 5)
    first_started = time.monotonic()
    run_partition(instance, resources, "alice", DAY, [distillations])
    first_alert_by = time.monotonic()  # the window opened before this
    openai_server.script(*[Reply.status(500)] * 5)
    run_partition(instance, resources, "alice", DAY, [distillations])  # the same error within the window: suppressed
    openai_server.script(Reply.status(500))
    run_partition(instance, resources, "alice", DAY, assets=[warmth])  # another type: its own alert
    assert time.monotonic() - first_started < window  # (the runs above really were inside one window)
    assert webhook.types() == ["distillation_failed", "warmth_failed"]

    # Another process raising the same type inside the window is suppressed too (alert_state row).
    script = (
        "import sys; from pydantic import SecretStr; from yak_pipeline.settings import Settings;"
        "from yak_pipeline.store.database import Database; from yak_pipeline.wiring import build_alerter;"
        "s = Settings(database_url=sys.argv[1], error_webhook=SecretStr(sys.argv[2]), alert_dedup_seconds=int(sys.argv[3]));"
        "db = Database(sys.argv[1]).open();"
        "print(build_alerter(s, db).alert('distillation_failed', 'from another process'))"
    )
    other = subprocess.run([sys.executable, "-c", script, database.url, webhook.url("/hook/error"), str(window)],
                           capture_output=True, text=True, timeout=60)
    assert other.returncode == 0, other.stderr[-2000:]
    assert other.stdout.strip() == "False"
    assert time.monotonic() - first_started < window  # all of the above really was inside one window
    suppressed = fetch_one(database, "SELECT suppressed FROM alert_state WHERE alert_type = 'distillation_failed'")[0]
    assert suppressed == 10  # 4 more failures in run 1, 5 in run 2, 1 from the other process

    time.sleep(max(0.0, window + 0.3 - (time.monotonic() - first_alert_by)))
    openai_server.script(*[Reply.status(500)] * 5)
    run_partition(instance, resources, "alice", DAY, [distillations])  # a new window: one new alert
    assert webhook.types() == ["distillation_failed", "warmth_failed", "distillation_failed"]
    report_figure("Alert de-duplication", f"10 distillation failures in 2 runs + 1 from another process within "
                  f"{window} s: 1 alert ({suppressed} suppressed); after the window: 1 more; warmth_failed in the "
                  f"same window: its own 1")


def test_an_exchange_that_keeps_failing_is_kept_as_failed_never_dropped(database: Database,
                                                                         openai_server: FakeOpenAIServer) -> None:
    [memory_id] = add_facts(database, 1)
    job = DistillJob(db=database, llm=OpenAIChatProvider(openai_server.base_url, "fake-model", max_retries=0,
                                                         timeout_seconds=2),
                     embedder=HashingEmbedder(384), prompt_version="v1")
    openai_server.script(*[Reply.text("not json")] * DEFAULT_MAX_ATTEMPTS)
    for _ in range(DEFAULT_MAX_ATTEMPTS + 2):
        distill_memories(job, [memory_id])
    # Five attempts, then it is given up on: kept with its text and its last error, not retried forever.
    status, attempts, error, content = fetch_one(
        database, "SELECT status, attempts, last_error, content FROM memories WHERE id = %s", (memory_id,))
    assert (status, attempts) == ("failed", DEFAULT_MAX_ATTEMPTS) and "not JSON" in error
    assert content == f"User: {fact_text(0)}\nAssistant: Noted."
    assert len(openai_server.chat_requests) == DEFAULT_MAX_ATTEMPTS
    assert _state(database).distillations == 0


class TaskFaults:
    """A replier that answers like a good model, except HTTP 500 for the tasks in ``failing``."""

    def __init__(self, *failing: str) -> None:
        self.failing = set(failing)

    def __call__(self, request: dict[str, Any]) -> Reply:
        task, _ = parse_payload(request["messages"][-1]["content"])
        if task in self.failing:
            return Reply.status(500)
        return rules_replier(request)


@pytest.mark.parametrize("task", ["conflict", "consolidate"])
def test_a_failing_conflict_or_merge_judgement_keeps_both_facts_and_is_retried(
        settings: Settings, database: Database, webhook: WebhookReceiver, task: str) -> None:
    replier = TaskFaults(task)
    with FakeOpenAIServer(replier) as server:
        older = add_exchange(database, "alice", "I love hiking in the Alps on weekends.", DAY)
        newer = add_exchange(database, "alice", "I love hiking in the Alps on weekends.", DAY, minute=5,
                             assistant="Sounds fun!")
        instance = new_instance("alice")
        resources = _resources(settings, server, webhook, max_retries=0)

        failing = run_partition(instance, resources, "alice", DAY)

        assert failing.success
        stage = "conflict_scores" if task == "conflict" else "distillation_versions"
        assert materialization_metadata(failing, stage)["failed"] >= 1
        # Both facts are still there, active and unchanged, with one version each.
        rows = fetch_all(database, "SELECT memory_id::text, status, content FROM distillations ORDER BY created_at")
        assert [(m, s) for m, s, _ in rows] == [(older, "active"), (newer, "active")]
        assert fetch_one(database, "SELECT count(*) FROM distillation_versions")[0] == 2
        assert _state(database).violations == []

        replier.failing.clear()
        recovered = run_partition(instance, resources, "alice", DAY)

        assert recovered.success
        statuses = dict(fetch_all(database, "SELECT memory_id::text, status FROM distillations"))
        assert statuses == {older: "active", newer: "merged"}
        merges = fetch_all(database, "SELECT reason FROM distillation_versions WHERE reason = 'merged'")
        assert len(merges) == 1 and _state(database).violations == []
        run_partition(instance, resources, "alice", DAY)
        assert len(fetch_all(database, "SELECT 1 FROM distillation_versions WHERE reason = 'merged'")) == 1
