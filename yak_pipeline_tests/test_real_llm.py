"""A real language model in the loop (issue 17): the pipeline's LLM judgements through a real model server.

One llama-cpp-python server (``python -m llama_cpp.server``, started by Yak's own
:func:`~yak_pipeline.llm.local_server.start_local_llm`, as ``yak up --local-llm`` starts it) serves
SmolLM2-135M-Instruct for the whole module. The Dagster assets run against it through the real
``openai`` client, and the checks are the pipeline's rules, whatever the model answers: every
exchange is either distilled (gated by its confidence, with its first version) or kept pending
with its reason; a malformed answer is counted and retried, never dropped; conflicts, merges and
warmth follow the rules for the scores the model gave. A handful of exchanges and short answers
keep it to about a minute on 2 cores (plus the one-time build of llama-cpp-python, ``make setup-llm``).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from yak_pipeline.core.dedup import is_conflict
from yak_pipeline.core.gates import confidence_gate
from yak_pipeline.core.sentences import count_sentences
from yak_pipeline.core.types import TIERS
from yak_pipeline.core.warmth import evaluate_warmth
from yak_pipeline.defs.resources import LLMResource
from yak_pipeline.defs.scores.assets import conflict_scores, distillation_versions, warmth
from yak_pipeline.embeddings.hashing import HashingEmbedder
from yak_pipeline.llm.local_server import LOCAL_MODEL_NAME, LocalLLM, LocalModelError, start_local_llm
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline.store.turns import insert_turn
from yak_pipeline_tests.pipeline_helpers import (
    DAY,
    add_exchange,
    fetch_all,
    fetch_one,
    materialization_metadata,
    new_instance,
    pipeline_env,  # noqa: F401 - fixture
    pipeline_resources,
    run_partition,
)
from yak_pipeline_tests.store_helpers import seed_memory_with_distillation

pytestmark = [pytest.mark.slow, pytest.mark.real_llm, pytest.mark.usefixtures("pipeline_env")]

EXCHANGES = [
    ("I live in Berlin and I work as a nurse at a children's hospital.", "That sounds rewarding!"),
    ("My sister Anna is a doctor in Munich.", "Nice, a family of carers."),
    ("I'm vegetarian, so please only suggest meatless recipes.", "Got it, meatless recipes only."),
    ("What's the capital of Australia?", "Canberra."),
]
# Too few tokens for any JSON answer: every reply is cut off, a real malformed answer.
TRUNCATING_MAX_TOKENS = 5
REQUEST_TIMEOUT_SECONDS = 120.0  # a busy 2-core machine; the model answers in seconds


@pytest.fixture(scope="module")
def local_llm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalLLM]:
    """The packaged model's server, one for the module (loading it is the slow part)."""
    log_path = tmp_path_factory.mktemp("local-llm") / "server.log"
    try:
        server = start_local_llm(log_path, threads=2)
    except LocalModelError as exc:
        pytest.fail(f"{exc.reason} (the real_llm tests need it: `make setup-llm`)")
    yield server
    server.stop()


def _resources(settings: Settings, server: LocalLLM, *, max_retries: int, max_tokens: int | None = None) -> dict:
    """The pipeline's resources with the LLM pointed at the real server (answers of at most
    ``max_tokens``, default the settings')."""
    resources = pipeline_resources(settings)
    resources["llm"] = LLMResource.from_settings(settings, base_url=server.base_url, model=server.model,
                                                 timeout_seconds=REQUEST_TIMEOUT_SECONDS, max_retries=max_retries,
                                                 concurrency=1, max_tokens=max_tokens or settings.llm_max_tokens)
    return resources


def _memories(db: Database) -> dict[str, tuple[str, int, str | None]]:
    return {r[0]: r[1:] for r in fetch_all(db, "SELECT id::text, status, attempts, last_error FROM memories")}


def test_malformed_answers_are_counted_kept_pending_and_retried_until_distilled(
        settings: Settings, database: Database, local_llm: LocalLLM) -> None:
    ids = [add_exchange(database, "alice", user, DAY, assistant=assistant, minute=i)
           for i, (user, assistant) in enumerate(EXCHANGES)]
    instance = new_instance("alice")

    # 1. Answers cut off at 5 tokens: each call's two attempts are invalid, counted, and the
    #    memories stay pending with the reason — none lost, nothing half-written.
    cut = run_partition(instance, _resources(settings, local_llm, max_retries=1, max_tokens=TRUNCATING_MAX_TOKENS),
                        "alice", DAY)

    assert cut.success
    meta = materialization_metadata(cut, "distillations")
    assert (meta["rows_in"], meta["rows_out"], meta["failed"]) == (4, 0, 4)
    assert (meta["llm_requests"], meta["llm_invalid_outputs"], meta["llm_failed_calls"]) == (8, 8, 4)
    assert meta["llm_valid_output_rate"] == 0.0
    for status, attempts, error in _memories(database).values():
        assert (status, attempts) == ("pending", 1)
        assert "distill failed after 2 attempts: reply truncated at the token limit" in error
    assert fetch_one(database, "SELECT count(*) FROM distillations")[0] == 0

    # 2. Room to answer: the next run retries them; each is now distilled, or pending with a reason.
    started = datetime.now(UTC)
    done = run_partition(instance, _resources(settings, local_llm, max_retries=2), "alice", DAY)

    assert done.success
    meta = materialization_metadata(done, "distillations")
    assert meta["rows_in"] == 4 and meta["rows_out"] + meta["failed"] == 4
    assert meta["rows_out"] >= 2, f"the real model distilled only {meta['rows_out']} of 4: {meta.get('first_error')}"
    assert meta["llm_models"] == f"{LOCAL_MODEL_NAME} ({meta['llm_calls']})"  # who answered, per call
    assert meta["prompt_tokens"] > 0 and meta["completion_tokens"] > 0
    assert 0 < meta["llm_latency_p50_ms"] <= meta["llm_latency_p95_ms"]
    # Every request got either a call's valid answer or an invalid one (no transport or HTTP errors here).
    assert meta["llm_requests"] == meta["llm_calls"] + meta["llm_invalid_outputs"]
    assert meta["llm_valid_output_rate"] == pytest.approx(
        meta["llm_calls"] / (meta["llm_calls"] + meta["llm_invalid_outputs"]), abs=1e-3)

    memories = _memories(database)
    assert set(memories) == set(ids)  # none lost
    rows = fetch_all(database, """
        SELECT d.memory_id::text, d.content, d.confidence, d.tier, d.status, d.needs_review, d.prompt_version,
               vector_dims(d.embedding), d.created_at, array_agg(v.reason ORDER BY v.version)
        FROM distillations d JOIN distillation_versions v ON v.distillation_id = d.id
        GROUP BY d.id""")
    by_memory = {r[0]: r[1:] for r in rows}
    for memory_id, (status, attempts, error) in memories.items():
        assert attempts == 2
        if status == "distilled":
            content, confidence, tier, row_status, needs_review, prompt, dims, created, reasons = by_memory[memory_id]
            assert 1 <= count_sentences(content) <= 4 and len(content) <= 1000
            assert 0.0 <= confidence <= 1.0 and tier in TIERS
            gate = confidence_gate(confidence)
            if row_status != "merged":  # a merged one passed the gate as active before the merge stage
                assert row_status == gate.status
                assert needs_review or not gate.needs_review  # the gate's flag (a conflict may flag it too)
            assert (prompt, dims) == (settings.prompt_version, 384) and created >= started
            assert reasons[0] == "distilled"
            assert error is None
        else:
            assert status == "pending" and memory_id not in by_memory
            assert error and "failed after 3 attempts" in error
    assert len(by_memory) == meta["rows_out"]


def test_conflicts_merges_and_warmth_follow_the_rules_for_the_real_models_scores(
        settings: Settings, database: Database, local_llm: LocalLLM) -> None:
    # Two pairs of near-identical memories (each pair shares a vector: similarity 1, above the
    # 0.85 bar). The real model judges the Berlin pair for contradiction, then (unless it calls
    # it a conflict) consolidates it; the coffee pair's conflict check is already done, so it
    # goes straight to consolidation. Then it judges how useful two recalled memories were.
    embedder = HashingEmbedder(384)
    now = datetime.now(UTC).replace(hour=12)
    pairs = {"berlin": embedder.embed_query("where the user lives"), "coffee": embedder.embed_query("coffee")}
    seeded: dict[str, str] = {}
    with database.connection() as conn:
        for i, (key, text, vector) in enumerate([
                ("berlin", "User lives in Berlin.", pairs["berlin"]),
                ("berlin_nurse", "User lives in Berlin and works as a nurse.", pairs["berlin"]),
                ("coffee", "User drinks coffee every morning.", pairs["coffee"]),
                ("coffee_black", "User drinks black coffee every morning.", pairs["coffee"])]):
            _, distillation_id = seed_memory_with_distillation(
                conn, user_id="bob", exchange=f"User: {text}\nAssistant: ok", distillation=text, embedding=vector,
                occurred_at=now.replace(microsecond=i))
            seeded[key] = str(distillation_id)
        conn.execute("UPDATE distillations SET conflict_checked_at = CASE WHEN id = ANY(%s::uuid[]) THEN now() END, "
                     "dedup_checked_at = NULL", ([seeded["coffee"], seeded["coffee_black"]],))
        turn = str(insert_turn(conn, user_id="bob", user_message="Any tips for a cafe in my city?",
                               assistant_message="In Berlin, try a cafe in Kreuzberg.",
                               recalled_ids=[seeded["berlin"], seeded["coffee"]], occurred_at=now))
    resources = _resources(settings, local_llm, max_retries=2)

    result = run_partition(new_instance("bob"), resources, "bob", now.date(),
                           assets=[conflict_scores, distillation_versions, warmth])

    assert result.success
    scored = materialization_metadata(result, "conflict_scores")
    merged = materialization_metadata(result, "distillation_versions")
    warmed = materialization_metadata(result, "warmth")
    assert scored["llm_calls"] + scored.get("llm_failed_calls", 0) >= 1  # the Berlin pair was judged
    assert merged["llm_calls"] + merged.get("llm_failed_calls", 0) >= 1  # the coffee pair was consolidated
    assert warmed["llm_calls"] + warmed.get("llm_failed_calls", 0) >= 1
    for meta in (scored, merged, warmed):
        assert meta["llm_models"] == f"{LOCAL_MODEL_NAME} ({meta['llm_calls']})"

    conflicts = fetch_all(database, "SELECT distillation_a::text, distillation_b::text, score, status FROM conflicts")
    statuses = dict(fetch_all(database, "SELECT id::text, status FROM distillations"))
    review = dict(fetch_all(database, "SELECT id::text, needs_review FROM distillations"))
    merges = {r[0]: r[1:] for r in fetch_all(database, """
        SELECT distillation_id::text, version, merged_from::text[], content FROM distillation_versions
        WHERE reason = 'merged'""")}
    for a, b, score, status in conflicts:
        assert is_conflict(score) and status == "open" and review[a] and review[b]  # > 0.7: both flagged
    for pair in (("berlin", "berlin_nurse"), ("coffee", "coffee_black")):
        ids = {seeded[key] for key in pair}
        in_conflict = any({a, b} == ids for a, b, *_ in conflicts)
        kept = ids & set(merges)
        if kept:
            # Consolidated: the older (by creation, then id) gets a new version merged from the
            # newer, which is now merged.
            [older] = kept
            [newer] = ids - kept
            version, merged_from, content = merges[older]
            assert not in_conflict and (version, merged_from) == (2, [newer])
            assert (statuses[older], statuses[newer]) == ("active", "merged")
            assert 1 <= count_sentences(content) <= 4
        else:
            # In conflict (never merged), or the model's consolidation stayed invalid after every
            # retry (counted as failed, nothing changed, the next run tries again).
            assert in_conflict or merged["failed"] >= 1
            assert {statuses[i] for i in ids} == {"active"}
    assert merged["flagged"] == len(merges)

    events = fetch_all(database, """SELECT distillation_id::text, relevance_score, delta, warmth_before, warmth_after
                                    FROM warmth_events WHERE turn_id = %s""", (turn,))
    turn_status, turn_error = fetch_one(database, "SELECT status, last_error FROM turns WHERE id = %s", (turn,))
    for _, relevance, delta, before, after in events:
        change = evaluate_warmth(before, relevance)  # the warmth rule, for the model's own score
        assert 0.0 <= relevance <= 1.0 and (delta, after) == (pytest.approx(change.delta), pytest.approx(change.after))
    if turn_status == "evaluated":
        assert len(events) == 2 and turn_error is None
    else:
        assert turn_status == "pending" and "failed after 3 attempts" in turn_error


def test_a_model_the_server_cannot_load_is_one_line_naming_the_log(tmp_path: Path) -> None:
    not_a_model = tmp_path / "notes.gguf"
    not_a_model.write_text("this is not a GGUF file\n")
    log_path = tmp_path / "server.log"
    with pytest.raises(LocalModelError) as caught:
        start_local_llm(log_path, model_path=not_a_model, threads=1, startup_timeout=60)
    reason = caught.value.reason
    assert reason.startswith("the local model server exited with code ") and str(log_path) in reason
    assert "\n" not in reason and log_path.stat().st_size > 0
