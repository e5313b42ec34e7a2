"""Recall's fast paths (issue 5): per-user HNSW indexes, the SQL-side exact scan, the tighter stop bound.

Each path must return exactly what the pure-Python reference ranking of every row returns.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import numpy as np
import psycopg
import pytest

from yak_pipeline.core.scoring import (
    RecallCandidate,
    ScoredMemory,
    can_stop_fetching,
    rank_candidates,
    score_upper_bound,
)
from yak_pipeline.store.hybrid import vector_search
from yak_pipeline.store.recall import (
    RecallParams,
    ensure_user_indexes,
    has_user_index,
    recall,
    recall_exact,
    user_index_name,
)
from yak_pipeline_tests.test_store_recall import MODEL, NOW, _seed


def _reference(candidates: list[RecallCandidate], params: RecallParams) -> list[str]:
    return [r.id for r in rank_candidates(candidates, threshold=params.threshold, limit=params.limit, now=NOW,
                                          half_life_days=params.half_life_days, decay_enabled=params.decay_enabled,
                                          core_multiplier=params.core_multiplier)]


def _plan(conn: psycopg.Connection, statement: str, args: dict) -> str:
    return "\n".join(r[0] for r in conn.execute("EXPLAIN " + statement, args).fetchall())


def test_user_indexes_are_built_per_heavy_user_and_recall_through_them_equals_the_reference(
        conn: psycopg.Connection) -> None:
    query, alice = _seed(conn, "alice", 11, 300)
    _seed(conn, "bob", 12, 300)
    _seed(conn, "carol", 13, 20)  # too few rows for an index of her own
    conn.execute("UPDATE memories SET embedding = d.embedding, embedding_model = d.embedding_model "
                 "FROM distillations d WHERE d.memory_id = memories.id")
    built = ensure_user_indexes(conn, min_rows=100, concurrently=False)
    assert set(built) == {user_index_name(t, u) for t in ("distillations", "memories") for u in ("alice", "bob")}
    assert ensure_user_indexes(conn, min_rows=100, concurrently=False) == []  # idempotent
    assert has_user_index(conn, "distillations", "alice") and not has_user_index(conn, "distillations", "carol")
    conn.execute("ANALYZE distillations")

    # The planner proves the partial index's predicate only from a literal user id.
    plan = _plan(conn, "SELECT id FROM distillations WHERE user_id = 'alice' AND status = 'active' "
                       "ORDER BY embedding <=> %(q)s LIMIT 40", {"q": query.astype(np.float32)})
    assert user_index_name("distillations", "alice") in plan

    rng = np.random.default_rng(3)
    for threshold, limit, decay in ((0.7, 5, True), (0.3, 10, True), (0.0, 25, False), (0.9, 3, True)):
        for q in (query, query + rng.normal(size=384) * 0.02):
            params = RecallParams(threshold=threshold, limit=limit, decay_enabled=decay)
            got = recall(conn, user_id="alice", query_embedding=q, embedding_model=MODEL, params=params, now=NOW)
            rows = conn.execute(
                "SELECT id, 1 - (embedding <=> %s) FROM distillations WHERE user_id = 'alice'",
                (np.asarray(q, dtype=np.float32),)).fetchall()
            similarity = {str(i): float(s) for i, s in rows}
            candidates = [RecallCandidate(id=c.id, similarity=similarity[c.id], tier=c.tier, warmth=c.warmth,
                                          user_weight=c.user_weight, refreshed_at=c.refreshed_at) for c in alice]
            assert [r.id for r in got] == _reference(candidates, params)

    # The exchange vector leg uses the user's own index too, and only ever returns the user's rows.
    hits = vector_search(conn, table="memories", user_id="alice", query_embedding=query, embedding_model=MODEL,
                         limit=10)
    exact = vector_search(conn, table="memories", user_id="alice", query_embedding=query, embedding_model=MODEL,
                          limit=10, exact=True)
    assert [h.id for h in hits] == [h.id for h in exact]

    # Forgetting most of a user's rows drops their index at the next maintenance run.
    conn.execute("UPDATE distillations SET deleted_at = now() WHERE user_id = 'bob'")
    ensure_user_indexes(conn, min_rows=100, concurrently=False)
    assert not has_user_index(conn, "distillations", "bob") and has_user_index(conn, "memories", "bob")


def test_concurrent_index_builds_need_autocommit(conn: psycopg.Connection) -> None:
    with pytest.raises(ValueError):
        ensure_user_indexes(conn, min_rows=1)


def test_exact_scan_in_sql_falls_back_when_scores_tie_at_the_boundary(conn: psycopg.Connection) -> None:
    """Thirty rows with the very same score: the SQL top cannot tell which belong in the top five,
    so the exact Python ranking of every row decides (ties break on id)."""
    vector = np.ones(384, dtype=np.float32) / np.sqrt(384)
    with conn.cursor() as cur:
        for i in range(30):
            cur.execute(
                """WITH m AS (INSERT INTO memories (user_id, content, source, content_sha256, status)
                              VALUES ('tie', %(c)s, 'import', encode(sha256(convert_to(%(c)s, 'UTF8')), 'hex'),
                                      'distilled') RETURNING id)
                   INSERT INTO distillations (memory_id, user_id, content, confidence, tier, warmth, status,
                                              embedding, embedding_model, prompt_version, refreshed_at)
                   SELECT id, 'tie', %(c)s, 0.9, 'medium', 0.5, 'active', %(e)s, %(model)s, 't', %(t)s FROM m""",
                {"c": f"same fact {i}", "e": vector, "model": MODEL, "t": NOW - timedelta(days=3)})
    params = RecallParams(threshold=0.5, limit=5)
    got = recall(conn, user_id="tie", query_embedding=vector, embedding_model=MODEL, params=params, now=NOW)
    want = recall_exact(conn, user_id="tie", query_embedding=vector, embedding_model=MODEL, params=params, now=NOW)
    assert len(got) == 5 and [r.id for r in got] == [r.id for r in want]


def _scored(score: float) -> ScoredMemory:
    return ScoredMemory(id="x", similarity=0.9, tier="medium", warmth=0.5, user_weight=1.0,
                        refreshed_at=datetime(2026, 1, 1, tzinfo=timezone.utc), score=score)


def test_stop_bound_counts_only_tiers_whose_gate_the_remaining_rows_can_pass() -> None:
    # threshold 0.7: core passes down to similarity 0.4, medium to 0.7, low to 0.85.
    assert score_upper_bound(0.8, 1.0) == pytest.approx(3.2)  # the old, tier-blind bound
    assert score_upper_bound(0.8, 1.0, threshold=0.7) == pytest.approx(3.2)  # core is still possible
    assert score_upper_bound(0.8, 1.0, threshold=0.7, core_multiplier=0.5) == pytest.approx(1.6)  # medium at most
    assert score_upper_bound(0.3, 1.0, threshold=0.7) == 0.0  # nothing that far passes any gate
    ranked = [_scored(2.0)]
    assert not can_stop_fetching(ranked, 1, 0.8, 1.0)
    assert can_stop_fetching(ranked, 1, 0.8, 1.0, threshold=0.7, core_multiplier=0.5)
    assert can_stop_fetching(ranked, 1, 0.3, 1.0, threshold=0.7)


def test_maintenance_builds_indexes_concurrently_outside_the_pool(database) -> None:
    from yak_pipeline.services.recall import maintain_recall_indexes

    with database.connection() as conn:
        _seed(conn, "dora", 21, 30)
        _seed(conn, "eve", 22, 5)
    assert maintain_recall_indexes(database, min_rows=10) == [user_index_name("distillations", "dora")]
    with database.connection() as conn:
        assert has_user_index(conn, "distillations", "dora") and not has_user_index(conn, "distillations", "eve")


def test_the_nightly_index_job_and_yak_db_index_build_indexes_for_heavy_users(database, db_url, monkeypatch) -> None:
    import dagster as dg
    from typer.testing import CliRunner

    from yak_pipeline.cli.main import app
    from yak_pipeline.defs.automation.jobs import recall_index_job
    from yak_pipeline.defs.automation.schedules import nightly_recall_index_schedule
    from yak_pipeline.defs.resources import PostgresResource

    with database.connection() as conn:
        _seed(conn, "fay", 31, 30)
        _seed(conn, "gus", 32, 5)
        _seed(conn, "hal", 33, 30)
    result = recall_index_job.execute_in_process(
        resources={"postgres": PostgresResource(database_url=db_url)},
        run_config={"ops": {"maintain_recall_indexes_op": {"config": {"min_rows": 10}}}},
        instance=dg.DagsterInstance.ephemeral(),
    )
    assert result.success
    assert sorted(result.output_for_node("maintain_recall_indexes_op")) == sorted([
        user_index_name("distillations", "fay"), user_index_name("distillations", "hal")])
    with database.connection() as conn:
        assert not has_user_index(conn, "distillations", "gus")
        conn.execute("DROP INDEX " + user_index_name("distillations", "hal"))
    # The CLI builds what is missing; a second run has nothing to do.
    from yak_pipeline.settings import get_settings

    monkeypatch.setenv("YAK_DATABASE_URL", db_url)
    monkeypatch.setenv("YAK_EMBEDDER", "hashing")  # what the test database was migrated for
    get_settings.cache_clear()
    cli = CliRunner()
    built = cli.invoke(app, ["db", "index", "--min-rows", "10", "--json"])
    assert built.exit_code == 0, built.output
    assert json.loads(built.output) == {"built": [user_index_name("distillations", "hal")], "contexts_rebuilt": None}
    again = cli.invoke(app, ["db", "index", "--min-rows", "10"])
    assert again.exit_code == 0 and "no user needs an index of their own" in again.output
    # The repair of exchange contexts (sql/006) recomputes every live exchange's.
    with database.connection() as conn:
        live = conn.execute("SELECT count(*) FROM memories WHERE deleted_at IS NULL").fetchone()[0]
        conn.execute("UPDATE memories SET context_tsv = NULL")
    repaired = cli.invoke(app, ["db", "index", "--min-rows", "10", "--rebuild-context", "--json"])
    assert repaired.exit_code == 0, repaired.output
    assert json.loads(repaired.output) == {"built": [], "contexts_rebuilt": live} and live > 0
    with database.connection() as conn:
        assert conn.execute("SELECT count(*) FROM memories WHERE context_tsv IS NULL").fetchone()[0] == 0
    # Scheduled at 03:00 local time, one run a day.
    assert nightly_recall_index_schedule.cron_schedule == "0 3 * * *"
