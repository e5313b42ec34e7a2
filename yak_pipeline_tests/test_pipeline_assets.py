"""The Dagster assets and the quality gate, materialized for real (DESIGN §4–§5, issue 3).

Every test runs ``dg.materialize`` on an ephemeral instance with the real resources: the test's
own migrated PostgreSQL database, the hashing embedder, and either the loopback OpenAI-protocol
server (``openai_server``, driven through the real ``openai`` client) or the offline rules provider.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, date, datetime
from typing import Any

import dagster as dg
import pytest

from yak_loopback.openai_replies import Reply, rules_replier
from yak_loopback.openai_server import FakeOpenAIServer
from yak_pipeline.defs.distillations.assets import distillations
from yak_pipeline.defs.partitions import add_missing_partitions, day_tags, runs_by_user
from yak_pipeline.defs.scores.assets import conflict_scores, distillation_versions, warmth
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline.store.partition_gates import partition_gate_passed
from yak_pipeline.store.turns import insert_turn
from yak_pipeline_tests.pipeline_helpers import (
    DAY,
    MEMORY_ASSETS,
    NEXT_DAY,
    add_exchange,
    at,
    fetch_all,
    fetch_one,
    materialization_metadata,
    materialized_assets,
    new_instance,
    pipeline_env,  # noqa: F401 - fixture
    pipeline_resources,
    run_partition,
)
from yak_pipeline_tests.store_helpers import seed_memory_with_distillation

pytestmark = pytest.mark.usefixtures("pipeline_env")


def _memory(db: Database, memory_id: str) -> tuple[str, int, str | None]:
    """(status, attempts, last_error) of a memory."""
    return fetch_one(db, "SELECT status, attempts, last_error FROM memories WHERE id = %s", (memory_id,))


def _distillation_count(db: Database, memory_id: str | None = None) -> int:
    return fetch_one(db, "SELECT count(*) FROM distillations WHERE %(m)s::uuid IS NULL OR memory_id = %(m)s::uuid",
                     {"m": memory_id})[0]


def _webhook_url(server: FakeOpenAIServer) -> str:
    """A webhook on the loopback server: it records the POST (and answers 404, which alerts tolerate)."""
    return f"http://127.0.0.1:{server.port}/hooks/yak"


def _webhook_posts(server: FakeOpenAIServer) -> list[dict[str, Any]]:
    return [r.body for r in server.requests if r.path == "/hooks/yak"]


# --- good output -----------------------------------------------------------------------------


def test_memory_run_distils_gates_embeds_and_reports(settings: Settings, database: Database,
                                                     openai_server: FakeOpenAIServer) -> None:
    direct = add_exchange(database, "alice", "I live in Berlin.", DAY)
    hedged = add_exchange(database, "alice", "I think I might like jazz.", DAY, minute=1)
    question = add_exchange(database, "alice", "What's a good movie tonight?", DAY, minute=2)
    other_user = add_exchange(database, "bob", "I live in Hamburg.", DAY)
    other_day = add_exchange(database, "alice", "I work as a nurse.", NEXT_DAY)
    instance = new_instance("alice", "bob")
    resources = pipeline_resources(settings, llm_base_url=openai_server.base_url, concurrency=4)

    result = run_partition(instance, resources, "alice", DAY)

    assert result.success
    assert materialized_assets(result) == {"raw_exchanges", "distillations", "conflict_scores", "distillation_versions"}
    assert [(c.check_name, c.passed) for c in result.get_asset_check_evaluations()] == [("distillation_quality", True)]
    raw = materialization_metadata(result, "raw_exchanges")
    assert raw["rows"] == 3 and raw["pending"] == 3 and raw["source_api"] == 3 and raw["hash_mismatches"] == 0
    meta = materialization_metadata(result, "distillations")
    assert (meta["rows_in"], meta["rows_out"], meta["failed"], meta["flagged"]) == (3, 3, 0, 2)
    assert meta["llm_provider"] == "openai" and meta["prompt_version"] == "v1" and meta["llm_calls"] == 3
    assert meta["llm_models"] == "fake-model (3)" and meta["llm_requests"] == 3 and meta["llm_invalid_outputs"] == 0
    assert 0 < meta["llm_latency_p50_ms"] <= meta["llm_latency_p95_ms"]
    assert meta["prompt_tokens"] > 0 and meta["completion_tokens"] > 0  # the server reports usage

    rows = {r[0]: r[1:] for r in fetch_all(database, """
        SELECT memory_id::text, content, confidence, tier, status, needs_review, prompt_version,
               vector_dims(embedding), embedding_model FROM distillations""")}
    assert set(rows) == {direct, hedged, question}  # only this partition: not bob's, not the next day's
    assert rows[direct] == ("User lives in Berlin.", 0.9, "core", "active", False, "v1", 384, "feature-hashing-384")
    assert rows[hedged][2:5] == ("medium", "active", True) and rows[hedged][1] == 0.65
    assert rows[question][3:5] == ("review", True) and rows[question][1] == 0.5
    versions = fetch_all(database, "SELECT version, reason, content FROM distillation_versions d")
    assert sorted(v[:2] for v in versions) == [(1, "distilled")] * 3
    assert {_memory(database, m)[0] for m in (direct, hedged, question)} == {"distilled"}
    assert _memory(database, other_user)[0] == "pending" and _memory(database, other_day)[0] == "pending"

    chats = openai_server.chat_requests
    assert len(chats) == 3
    assert all(r.body["model"] == "fake-model" and r.headers["authorization"] == "Bearer test-key" for r in chats)

    again = run_partition(instance, resources, "alice", DAY)
    assert again.success
    assert materialization_metadata(again, "distillations")["rows_in"] == 0
    assert len(openai_server.chat_requests) == 3  # nothing distilled twice
    assert _distillation_count(database) == 3


def test_distillation_calls_run_concurrently(settings: Settings, database: Database,
                                             openai_server: FakeOpenAIServer) -> None:
    for minute, text in enumerate(["I live in Oslo.", "I have a dog.", "I play chess.", "I like tea."]):
        add_exchange(database, "alice", text, DAY, minute=minute)
    openai_server.script(*[Reply.delay(0.6)] * 4)  # each answer (the default replier's) takes 0.6 s
    resources = pipeline_resources(settings, llm_base_url=openai_server.base_url, concurrency=4)

    started = time.monotonic()
    result = run_partition(new_instance("alice"), resources, "alice", DAY, assets=[distillations])
    elapsed = time.monotonic() - started

    assert result.success
    assert materialization_metadata(result, "distillations")["rows_out"] == 4
    assert elapsed < 4 * 0.6, f"four 0.6 s calls took {elapsed:.2f} s: they ran one after another"


def test_raw_exchanges_flags_rows_whose_hash_no_longer_matches(settings: Settings, database: Database) -> None:
    add_exchange(database, "alice", "I live in Berlin.", DAY, source="drop_folder")
    tampered = add_exchange(database, "alice", "I like tea.", DAY, minute=1)
    with database.connection() as conn:
        conn.execute("UPDATE memories SET content = 'User: I like coffee.\nAssistant: Noted.' WHERE id = %s",
                     (tampered,))

    result = run_partition(new_instance("alice"), pipeline_resources(settings), "alice", DAY,
                           assets=[MEMORY_ASSETS[0]])

    meta = materialization_metadata(result, "raw_exchanges")
    assert (meta["rows"], meta["flagged"], meta["hash_mismatches"]) == (2, 1, 1)
    assert meta["source_api"] == 1 and meta["source_drop_folder"] == 1


# --- bad output, failures and recovery ---------------------------------------------------------


def test_malformed_json_keeps_the_memory_pending_with_the_error_then_the_next_run_distils_it(
        settings: Settings, database: Database, openai_server: FakeOpenAIServer) -> None:
    memory = add_exchange(database, "alice", "I live in Berlin.", DAY)
    openai_server.script(Reply.text('{"content": "User lives in Berl'))
    instance = new_instance("alice")
    resources = pipeline_resources(settings, llm_base_url=openai_server.base_url,
                                   error_webhook=_webhook_url(openai_server))

    result = run_partition(instance, resources, "alice", DAY)

    assert result.success  # a failed memory is data, not a crashed run
    meta = materialization_metadata(result, "distillations")
    assert (meta["rows_in"], meta["rows_out"], meta["failed"]) == (1, 0, 1)
    assert "JSON" in meta["first_error"]
    # The malformed answer is counted: one request, one invalid answer, one call that gave up.
    assert (meta["llm_requests"], meta["llm_invalid_outputs"], meta["llm_failed_calls"]) == (1, 1, 1)
    assert meta["llm_valid_output_rate"] == 0.0
    status, attempts, error = _memory(database, memory)
    assert status == "pending" and attempts == 1 and "JSON" in error
    assert _distillation_count(database) == 0
    posts = _webhook_posts(openai_server)
    assert len(posts) == 1 and "distillation_failed" in posts[0]["content"]
    assert memory in json.dumps(posts[0])

    retry = run_partition(instance, resources, "alice", DAY)

    meta = materialization_metadata(retry, "distillations")
    assert meta["rows_out"] == 1 and meta["llm_valid_output_rate"] == 1.0
    assert meta["llm_models"] == "fake-model (1)"  # the model that answered, per call
    assert _memory(database, memory) == ("distilled", 2, None)
    assert fetch_all(database, "SELECT content FROM distillations") == [("User lives in Berlin.",)]


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ({"content": "User lives in Berlin.", "confidence": 100, "tier": "core", "type": "fact"}, "confidence"),
        ({"content": "User lives in Berlin.", "confidence": "high", "tier": "core", "type": "fact"}, "confidence"),
        ({"content": "User lives in Berlin.", "confidence": 0.9, "tier": "urgent", "type": "fact"}, "tier"),
        ({"content": "A. B. C. D. E.", "confidence": 0.9, "tier": "core", "type": "fact"}, "sentences"),
    ],
    ids=["confidence-100", "confidence-text", "unknown-tier", "five-sentences"],
)
def test_invalid_output_is_rejected_not_clamped(settings: Settings, database: Database,
                                                openai_server: FakeOpenAIServer, answer: dict, reason: str) -> None:
    memory = add_exchange(database, "alice", "I live in Berlin.", DAY)
    openai_server.script(Reply.json(answer))

    result = run_partition(new_instance("alice"), pipeline_resources(settings, llm_base_url=openai_server.base_url),
                           "alice", DAY)

    assert materialization_metadata(result, "distillations")["failed"] == 1
    status, _, error = _memory(database, memory)
    assert status == "pending" and reason in error
    # Not stored in any form: no row at confidence 1.0 (clamped) or 100, no truncated text.
    assert _distillation_count(database) == 0
    assert fetch_one(database, "SELECT count(*) FROM distillation_versions")[0] == 0


@pytest.mark.parametrize(
    ("failure", "expected_error"),
    [(Reply.status(500), "HTTP 500"), (Reply.delay(3.0), "no reply"), (Reply.close(), "cannot reach")],
    ids=["http-500", "timeout", "dropped-connection"],
)
def test_unavailable_llm_leaves_the_memory_pending_and_the_next_run_recovers(
        settings: Settings, database: Database, openai_server: FakeOpenAIServer, failure: Reply,
        expected_error: str) -> None:
    memory = add_exchange(database, "alice", "I live in Berlin.", DAY)
    openai_server.script(failure)
    instance = new_instance("alice")
    resources = pipeline_resources(settings, llm_base_url=openai_server.base_url, timeout_seconds=0.5)

    failed = run_partition(instance, resources, "alice", DAY)

    assert failed.success
    assert materialization_metadata(failed, "distillations")["failed"] == 1
    status, attempts, error = _memory(database, memory)
    assert (status, attempts) == ("pending", 1) and expected_error in error
    assert _distillation_count(database) == 0

    recovered = run_partition(instance, resources, "alice", DAY)

    assert materialization_metadata(recovered, "distillations")["rows_out"] == 1
    assert _memory(database, memory) == ("distilled", 2, None)
    assert _distillation_count(database, memory) == 1


def test_a_transient_500_is_retried_within_the_same_run(settings: Settings, database: Database,
                                                        openai_server: FakeOpenAIServer) -> None:
    memory = add_exchange(database, "alice", "I live in Berlin.", DAY)
    openai_server.script(Reply.status(503))
    resources = pipeline_resources(settings, llm_base_url=openai_server.base_url, max_retries=1)

    result = run_partition(new_instance("alice"), resources, "alice", DAY, assets=[distillations])

    assert materialization_metadata(result, "distillations")["rows_out"] == 1
    assert len(openai_server.chat_requests) == 2  # one failure, one retry, no more
    assert _memory(database, memory) == ("distilled", 1, None)


def test_confidence_gate_decides_status_and_review_flag(settings: Settings, database: Database,
                                                        openai_server: FakeOpenAIServer) -> None:
    memories = [add_exchange(database, "alice", text, DAY, minute=i)
                for i, text in enumerate(["I live in Berlin.", "I like jazz.", "I have a cat."])]
    # One worker: the memories are distilled oldest first, so the replies line up with them.
    openai_server.script(
        Reply.json({"content": "User lives in Berlin.", "confidence": 0.8, "tier": "core", "type": "fact"}),
        Reply.json({"content": "User likes jazz.", "confidence": 0.65, "tier": "medium", "type": "fact"}),
        Reply.json({"content": "User has a cat.", "confidence": 0.5, "tier": "low", "type": "fact"}),
    )

    result = run_partition(new_instance("alice"), pipeline_resources(settings, llm_base_url=openai_server.base_url),
                           "alice", DAY)

    assert result.success
    gated = dict(fetch_all(database, "SELECT memory_id::text, (confidence, status, needs_review)::text FROM distillations"))
    assert gated == {memories[0]: "(0.8,active,f)", memories[1]: "(0.65,active,t)", memories[2]: "(0.5,review,t)"}
    assert materialization_metadata(result, "distillations")["flagged"] == 2
    assert [c.passed for c in result.get_asset_check_evaluations()] == [True]


# --- the blocking quality gate -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "embedded", "failure"),
    [
        # The database allows both rows (status review); only the gate's expectations catch them.
        ("One. Two. Three. Four. Five. Six.", True, "sentences"),
        ("User likes tea.", False, "embedding_dim"),
    ],
    ids=["six-sentences", "no-embedding"],
)
def test_failing_quality_gate_skips_downstream_and_holds_later_runs_back(
        settings: Settings, database: Database, content: str, embedded: bool, failure: str) -> None:
    with database.connection() as conn:
        _, bad = seed_memory_with_distillation(conn, user_id="alice", exchange="User: hi\nAssistant: hello",
                                               distillation="User said hi.", confidence=0.5,
                                               occurred_at=datetime(2026, 3, 14, 9, tzinfo=UTC))
        # The current prompt version, so the run does not re-distil (and so repair) the bad row.
        conn.execute("UPDATE distillations SET content = %s, embedding = CASE WHEN %s THEN embedding END, "
                     "prompt_version = 'v1' WHERE id = %s", (content, embedded, bad))
    fresh = add_exchange(database, "alice", "I live in Berlin.", DAY)
    add_exchange(database, "bob", "I live in Berlin.", DAY)
    instance = new_instance("alice", "bob")
    resources = pipeline_resources(settings)

    gated = run_partition(instance, resources, "alice", DAY)

    assert not gated.success
    [evaluation] = gated.get_asset_check_evaluations()
    assert not evaluation.passed and failure in str(evaluation.metadata["failures"].value)
    assert materialized_assets(gated) == {"raw_exchanges", "distillations"}  # the check blocked the rest
    new_id = fetch_one(database, "SELECT id FROM distillations WHERE memory_id = %s", (fresh,))[0]
    assert fetch_one(database, "SELECT conflict_checked_at, dedup_checked_at FROM distillations WHERE id = %s",
                     (new_id,)) == (None, None)

    # A later run of the downstream assets alone (no check in it) is held back by the stored verdict.
    later = run_partition(instance, resources, "alice", DAY, assets=[conflict_scores, distillation_versions])
    assert later.success
    for asset in ("conflict_scores", "distillation_versions"):
        assert materialization_metadata(later, asset)["held_back_by_quality_gate"] is True
    assert fetch_one(database, "SELECT conflict_checked_at FROM distillations WHERE id = %s", (new_id,))[0] is None

    # Another user's partition is not held back by alice's.
    bob = run_partition(instance, resources, "bob", DAY)
    assert bob.success and "held_back_by_quality_gate" not in materialization_metadata(bob, "conflict_scores")

    # Once a person fixes the row, the gate passes and the held-back work runs.
    with database.connection() as conn:
        conn.execute("DELETE FROM distillations WHERE id = %s", (bad,))
    fixed = run_partition(instance, resources, "alice", DAY)
    assert fixed.success
    conflicts = materialization_metadata(fixed, "conflict_scores")
    assert "held_back_by_quality_gate" not in conflicts and conflicts["rows_in"] == 1
    assert fetch_one(database, "SELECT conflict_checked_at IS NOT NULL AND dedup_checked_at IS NOT NULL "
                               "FROM distillations WHERE id = %s", (new_id,))[0]


def test_a_run_of_several_days_works_each_day_keeps_each_days_verdict_and_holds_back_only_the_failing_day(
        settings: Settings, database: Database) -> None:
    days = [date(2026, 3, 16), date(2026, 3, 14), date(2026, 3, 15)]  # the order they arrive
    for when in days:
        add_exchange(database, "alice", f"I visited a new museum on {when:%B %d}.", when)
    add_exchange(database, "bob", "I visited a museum too.", date(2026, 3, 15))
    with database.connection() as conn:  # a row only the gate catches, on the 14th
        _, bad = seed_memory_with_distillation(conn, user_id="alice", exchange="User: hi\nAssistant: hello",
                                               distillation="User said hi.", occurred_at=at(date(2026, 3, 14), 9))
        conn.execute("UPDATE distillations SET content = 'One. Two. Three. Four. Five. Six.', prompt_version = 'v1' "
                     "WHERE id = %s", (bad,))
    instance = new_instance()
    add_missing_partitions(instance, [("alice", when) for when in days] + [("bob", date(2026, 3, 15))])
    # The planner the sensors and `yak process` share: one run per user, whatever the order of days.
    plan = runs_by_user([("alice", when) for when in days] + [("bob", date(2026, 3, 15))])
    assert plan == [("alice", sorted(days)), ("bob", [date(2026, 3, 15)])]
    resources = pipeline_resources(settings)
    tags = day_tags(plan[0][1])

    run = dg.materialize(MEMORY_ASSETS, resources=resources, instance=instance, partition_key="alice",
                         raise_on_error=False, tags=tags)

    # Alice's three days in one run of her partition, and nobody else's: bob's exchange is still pending.
    assert {e.event_specific_data.materialization.partition for e in run.get_asset_materialization_events()} \
        == {"alice"}
    assert materialization_metadata(run, "raw_exchanges")["day_span"] == "2026-03-14 … 2026-03-16"
    assert fetch_one(database, "SELECT count(*) FROM memories WHERE user_id = 'alice' AND status = 'distilled'")[0] == 4
    assert fetch_one(database, "SELECT status FROM memories WHERE user_id = 'bob'")[0] == "pending"
    [evaluation] = run.get_asset_check_evaluations()
    assert not evaluation.passed and evaluation.metadata["failing_days"].value == "2026-03-14|alice"
    with database.connection() as conn:
        assert [partition_gate_passed(conn, user_id="alice", day=when) for when in days] == [True, False, True]
    # The downstream steps over the same days: the failing day is held back, the others go on.
    later = dg.materialize([conflict_scores, distillation_versions], resources=resources, instance=instance,
                           partition_key="alice", raise_on_error=False, tags=tags)
    conflicts = materialization_metadata(later, "conflict_scores")
    assert later.success and conflicts["days_held_back_by_quality_gate"] == 1 and conflicts["rows_in"] == 2


# --- conflicts and near-duplicates ---------------------------------------------------------------


def test_contradictions_are_recorded_and_both_sides_flagged(settings: Settings, database: Database,
                                                            openai_server: FakeOpenAIServer) -> None:
    add_exchange(database, "alice", "I live in Berlin.", DAY)
    add_exchange(database, "alice", "I live in Paris.", DAY, minute=1)
    resources = pipeline_resources(settings, llm_base_url=openai_server.base_url,
                                   error_webhook=_webhook_url(openai_server))

    result = run_partition(new_instance("alice"), resources, "alice", DAY)

    assert result.success
    assert materialization_metadata(result, "conflict_scores")["flagged"] == 1
    [(score, status)] = fetch_all(database, "SELECT score, status FROM conflicts")
    assert score > 0.7 and status == "open"
    flagged = fetch_all(database, "SELECT content, status, needs_review FROM distillations ORDER BY content")
    assert flagged == [("User lives in Berlin.", "active", True), ("User lives in Paris.", "active", True)]
    assert fetch_one(database, "SELECT count(*) FROM distillation_versions WHERE reason = 'merged'")[0] == 0


def test_near_duplicates_merge_into_a_version_of_the_older_never_across_users(
        settings: Settings, database: Database, openai_server: FakeOpenAIServer) -> None:
    older_memory = add_exchange(database, "alice", "I love hiking in the Alps on weekends.", DAY)
    instance = new_instance("alice", "bob")
    resources = pipeline_resources(settings, llm_base_url=openai_server.base_url)
    assert run_partition(instance, resources, "alice", DAY).success
    # The same fact again the next day (another exchange, so another memory), and from bob.
    newer_memory = add_exchange(database, "alice", "I love hiking in the Alps on weekends.", NEXT_DAY,
                                assistant="Sounds fun!")
    bobs_memory = add_exchange(database, "bob", "I love hiking in the Alps on weekends.", NEXT_DAY)

    bob = run_partition(instance, resources, "bob", NEXT_DAY)
    alice = run_partition(instance, resources, "alice", NEXT_DAY)

    assert bob.success and alice.success
    assert materialization_metadata(bob, "distillation_versions")["flagged"] == 0
    assert materialization_metadata(alice, "distillation_versions")["flagged"] == 1
    by_memory = {r[0]: r[1:] for r in fetch_all(database, "SELECT memory_id::text, id::text, status FROM distillations")}
    older_id, newer_id, bobs_id = (by_memory[m][0] for m in (older_memory, newer_memory, bobs_memory))
    assert by_memory[older_memory][1] == "active" and by_memory[newer_memory][1] == "merged"
    assert by_memory[bobs_memory][1] == "active"
    versions = fetch_all(database, """SELECT distillation_id::text, version, reason, merged_from::text[], content
                                      FROM distillation_versions ORDER BY distillation_id, version""")
    older_versions = [v[1:] for v in versions if v[0] == older_id]
    assert older_versions == [(1, "distilled", [], "User loves hiking in the Alps on weekends."),
                              (2, "merged", [newer_id], "User loves hiking in the Alps on weekends.")]
    assert [v[1:3] for v in versions if v[0] == bobs_id] == [(1, "distilled")]
    assert not any(bobs_id in v[3] for v in versions)


def test_a_conflicting_pair_is_never_merged(settings: Settings, database: Database,
                                            openai_server: FakeOpenAIServer) -> None:
    def judge_everything_contradictory(request: dict) -> Reply:
        if "contradiction judge" in request["messages"][0]["content"]:
            return Reply.json({"score": 0.95})
        return rules_replier(request)

    openai_server.replier = judge_everything_contradictory
    # Two exchanges distilled to the same text: near-duplicates (similarity 1.0) in every way but this one.
    add_exchange(database, "alice", "I love hiking in the Alps on weekends.", DAY)
    add_exchange(database, "alice", "I love hiking in the Alps on weekends.", DAY, minute=1, assistant="Fun!")

    result = run_partition(new_instance("alice"), pipeline_resources(settings, llm_base_url=openai_server.base_url),
                           "alice", DAY)

    assert result.success
    assert fetch_all(database, "SELECT score, status FROM conflicts") == [(0.95, "open")]
    assert fetch_all(database, "SELECT status, needs_review FROM distillations") == [("active", True)] * 2
    assert fetch_one(database, "SELECT count(*) FROM distillation_versions WHERE reason = 'merged'")[0] == 0
    assert materialization_metadata(result, "distillation_versions")["flagged"] == 0


# --- warmth ------------------------------------------------------------------------------------


def _seed_recalled(database: Database, today: date) -> tuple[str, str]:
    when = datetime.combine(today, datetime.min.time(), tzinfo=UTC)
    with database.connection() as conn:
        _, useful = seed_memory_with_distillation(conn, user_id="alice", exchange="User: I live in Berlin.\nAssistant: ok",
                                                  distillation="User lives in Berlin.", occurred_at=when)
        _, useless = seed_memory_with_distillation(conn, user_id="alice",
                                                   exchange="User: I'm allergic to peanuts.\nAssistant: ok",
                                                   distillation="User is allergic to peanuts.", occurred_at=when)
    return str(useful), str(useless)


def _add_turn(database: Database, recalled: list[str]) -> str:
    with database.connection() as conn:
        return str(insert_turn(conn, user_id="alice", user_message="Which city do I live in, Berlin?",
                               assistant_message="You live in Berlin.", recalled_ids=recalled))


def _warmth_state(database: Database) -> tuple[dict[str, float], list[tuple]]:
    warmth_by_id = dict(fetch_all(database, "SELECT id::text, warmth FROM distillations"))
    events = fetch_all(database, """SELECT distillation_id::text, turn_id::text, delta, warmth_before, warmth_after, reason
                                    FROM warmth_events ORDER BY id""")
    return warmth_by_id, events


NIGHTLY = {"ops": {"warmth": {"config": {"nightly": True, "days": 7}}}}


def test_warmth_per_turn_is_counted_once_even_when_rerun_or_rerun_nightly(
        settings: Settings, database: Database, openai_server: FakeOpenAIServer) -> None:
    today = datetime.now(UTC).date()
    useful, useless = _seed_recalled(database, today)
    turn = _add_turn(database, [useful, useless])
    instance = new_instance("alice")
    resources = pipeline_resources(settings, llm_base_url=openai_server.base_url)

    first = run_partition(instance, resources, "alice", today, assets=[warmth])

    meta = materialization_metadata(first, "warmth")
    assert (meta["rows_in"], meta["rows_out"], meta["flagged"], meta["llm_calls"]) == (1, 1, 2, 2)
    warmth_by_id, events = _warmth_state(database)
    assert warmth_by_id == {useful: pytest.approx(0.6), useless: pytest.approx(0.3)}
    assert sorted(events) == sorted([(useful, turn, pytest.approx(0.1), 0.5, pytest.approx(0.6), "turn"),
                                     (useless, turn, pytest.approx(-0.2), 0.5, pytest.approx(0.3), "turn")])
    assert fetch_one(database, "SELECT status FROM turns WHERE id = %s", (turn,)) == ("evaluated",)

    rerun = run_partition(instance, resources, "alice", today, assets=[warmth])
    nightly = run_partition(instance, resources, "alice", today, assets=[warmth], run_config=NIGHTLY)

    assert materialization_metadata(rerun, "warmth")["rows_in"] == 0
    assert materialization_metadata(nightly, "warmth")["rows_in"] == 1  # the nightly pass looks again …
    assert materialization_metadata(nightly, "warmth")["llm_calls"] == 0  # … and finds every pair counted
    assert _warmth_state(database) == (warmth_by_id, events)
    assert len(openai_server.chat_requests) == 2


def test_nightly_pass_evaluates_recalled_memories_a_failed_turn_left_out(
        settings: Settings, database: Database, openai_server: FakeOpenAIServer) -> None:
    today = datetime.now(UTC).date()
    useful, useless = _seed_recalled(database, today)
    turn = _add_turn(database, [useful, useless])
    first_id, second_id = sorted([useful, useless])  # a turn's recalled ids are evaluated in id order
    openai_server.script(Reply.json({"score": 0.9}), Reply.status(500))
    instance = new_instance("alice")
    resources = pipeline_resources(settings, llm_base_url=openai_server.base_url)

    failed = run_partition(instance, resources, "alice", today, assets=[warmth])

    assert materialization_metadata(failed, "warmth")["failed"] == 1
    status, error = fetch_one(database, "SELECT status, last_error FROM turns WHERE id = %s", (turn,))
    assert status == "pending" and "HTTP 500" in error
    _, events = _warmth_state(database)
    assert [e[0] for e in events] == [first_id]

    nightly = run_partition(instance, resources, "alice", today, assets=[warmth], run_config=NIGHTLY)

    assert materialization_metadata(nightly, "warmth")["llm_calls"] == 1  # only the pair left out
    _, events = _warmth_state(database)
    assert sorted(e[0] for e in events) == sorted([first_id, second_id])
    assert [e[5] for e in events] == ["turn", "nightly"]
    assert fetch_one(database, "SELECT count(*) = count(DISTINCT (turn_id, distillation_id)) FROM warmth_events")[0]
    assert fetch_one(database, "SELECT status FROM turns WHERE id = %s", (turn,)) == ("evaluated",)


# --- re-distillation backfill ---------------------------------------------------------------------


def test_prompt_version_backfill_writes_new_versions_and_keeps_the_old_text(
        settings: Settings, database: Database, openai_server: FakeOpenAIServer) -> None:
    days = (DAY, NEXT_DAY)
    memories = [add_exchange(database, "alice", "I live in Berlin.", DAY),
                add_exchange(database, "alice", "I work as a nurse.", NEXT_DAY)]
    instance = new_instance("alice")
    resources = pipeline_resources(settings, llm_base_url=openai_server.base_url)
    for day in days:
        assert run_partition(instance, resources, "alice", day).success
    before = dict(fetch_all(database, "SELECT memory_id::text, id::text FROM distillations"))

    # A prompt change: the resources of the next runs are built from settings naming the new version.
    resources = pipeline_resources(settings.model_copy(update={"prompt_version": "v2"}),
                                   llm_base_url=openai_server.base_url)
    openai_server.script(Reply.json({"content": "User lives in Berlin, Germany.", "confidence": 0.95, "tier": "core", "type": "fact"}),
                         Reply.json({"content": "User is a nurse.", "confidence": 0.9, "tier": "core", "type": "fact"}))
    backfill = [run_partition(instance, resources, "alice", day) for day in days]  # a backfill over two days

    assert all(r.success for r in backfill)
    assert [materialization_metadata(r, "distillations")["rows_out"] for r in backfill] == [1, 1]
    assert materialization_metadata(backfill[0], "distillations")["prompt_version"] == "v2"
    after = {r[0]: r[1:] for r in fetch_all(database, """SELECT memory_id::text, id::text, content, prompt_version,
                                                                confidence FROM distillations""")}
    assert {m: a[0] for m, a in after.items()} == before  # the same distillations, re-distilled in place
    assert after[memories[0]][1:] == ("User lives in Berlin, Germany.", "v2", 0.95)
    assert after[memories[1]][1:3] == ("User is a nurse.", "v2")
    history = fetch_all(database, """SELECT version, reason, prompt_version, content FROM distillation_versions
                                     WHERE distillation_id = %s ORDER BY version""", (before[memories[0]],))
    assert history == [(1, "distilled", "v1", "User lives in Berlin."),
                       (2, "redistilled", "v2", "User lives in Berlin, Germany.")]

    # Up to date now: the same version re-distils nothing, and a run told not to backfill leaves v2 rows alone.
    assert materialization_metadata(run_partition(instance, resources, "alice", DAY), "distillations")["rows_in"] == 0
    resources = pipeline_resources(settings.model_copy(update={"prompt_version": "v3"}),
                                   llm_base_url=openai_server.base_url)
    no_backfill = run_partition(instance, resources, "alice", DAY, assets=[distillations],
                                run_config={"ops": {"distillations": {"config": {"redistill_outdated": False}}}})
    assert materialization_metadata(no_backfill, "distillations")["rows_in"] == 0
    assert {r[0] for r in fetch_all(database, "SELECT prompt_version FROM distillations")} == {"v2"}
