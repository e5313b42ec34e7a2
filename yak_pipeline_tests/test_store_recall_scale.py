"""Recall at scale (issue 5): per-user HNSW indexes, and the index paths agree with the exact scan.

The vector legs go through a user's own partial HNSW index (or the shared one) when that is
cheaper; ``recall(..., exact=True)`` scans every row exactly and is the reference they must match.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import numpy as np
import psycopg
import pytest

from yak_pipeline.core.recall import RecallParams
from yak_pipeline.core.relevance import RelevanceModel
from yak_pipeline.store.recall import (
    ensure_user_indexes,
    has_user_index,
    recall,
    recall_candidates,
    user_index_name,
    vector_search,
)
from yak_pipeline_tests.store_helpers import EMBEDDER
from yak_pipeline_tests.test_recall_engine import FITTED

NOW = datetime(2026, 6, 1, tzinfo=timezone.utc)
MODEL = EMBEDDER.model_name
TIERS = ("core", "medium", "low")
WORDS = ("kitten", "violin", "garden", "coffee", "train", "piano", "lake", "bread")


def _seed(conn: psycopg.Connection, user_id: str, seed: int, n: int, *, exchange_vectors: bool = False) -> np.ndarray:
    """Insert n memories with active distillations whose similarity to a query spans the whole range.

    Returns the query vector. With ``exchange_vectors`` each exchange gets its distillation's vector.
    """
    rng = np.random.default_rng(seed)
    query = rng.normal(size=384)
    query /= np.linalg.norm(query)
    with conn.cursor() as cur:
        for i in range(n):
            # Mix the query with noise so similarities spread over [-1, 1] instead of clustering at 0.
            mix = rng.uniform(-0.3, 1.0)
            vector = mix * query + (1 - abs(mix)) * rng.normal(size=384) / np.sqrt(384) * 3
            vector = (vector / np.linalg.norm(vector)).astype(np.float32)
            words = " ".join(str(w) for w in rng.choice(WORDS, size=2))
            cur.execute(
                """WITH m AS (INSERT INTO memories (user_id, content, source, content_sha256, status, occurred_at,
                                                    embedding, embedding_model)
                              VALUES (%(u)s, %(c)s::text, 'import',
                                      encode(sha256(convert_to(%(c)s::text, 'UTF8')), 'hex'),
                                      'distilled', %(t)s, %(me)s, %(mm)s)
                              RETURNING id)
                   INSERT INTO distillations (memory_id, user_id, content, confidence, tier, warmth, user_weight,
                                              status, embedding, embedding_model, prompt_version, refreshed_at)
                   SELECT id, %(u)s, %(c)s, 0.9, %(tier)s, %(w)s, %(uw)s, 'active', %(e)s, %(model)s, 't', %(t)s
                   FROM m""",
                {"u": user_id, "c": f"fact {seed} {i} {words}", "t": NOW - timedelta(days=float(rng.uniform(0, 200))),
                 "tier": TIERS[int(rng.integers(3))], "w": float(rng.uniform(0, 1)),
                 "uw": float(rng.choice([1.0, 1.0, 0.5, 1.5, 3.0])), "e": vector, "model": MODEL,
                 "me": vector if exchange_vectors else None, "mm": MODEL if exchange_vectors else None},
            )
    return query


def _plan(conn: psycopg.Connection, statement: str, args: dict) -> str:
    return "\n".join(r[0] for r in conn.execute("EXPLAIN " + statement, args).fetchall())


def _recall(conn: psycopg.Connection, user_id: str, query: str, vector: np.ndarray, params: RecallParams, *,
            exact: bool = False, model: RelevanceModel = FITTED) -> list:
    return recall(conn, user_id=user_id, query=query, query_embedding=vector, embedding_model=MODEL, params=params,
                  model=model, now=NOW, exact=exact)


def test_user_indexes_are_built_per_heavy_user_and_recall_through_them_equals_the_exact_scan(
        conn: psycopg.Connection) -> None:
    query = _seed(conn, "alice", 11, 300, exchange_vectors=True)
    _seed(conn, "bob", 12, 300, exchange_vectors=True)
    _seed(conn, "carol", 13, 20, exchange_vectors=True)  # too few rows for an index of her own
    built = ensure_user_indexes(conn, min_rows=100, concurrently=False)
    assert set(built) == {user_index_name(t, u) for t in ("distillations", "memories") for u in ("alice", "bob")}
    assert ensure_user_indexes(conn, min_rows=100, concurrently=False) == []  # idempotent
    assert has_user_index(conn, "distillations", "alice") and not has_user_index(conn, "distillations", "carol")
    conn.execute("ANALYZE distillations")
    conn.execute("ANALYZE memories")

    # The planner proves the partial index's predicate only from a literal user id.
    plan = _plan(conn, "SELECT id FROM distillations WHERE user_id = 'alice' AND status = 'active' "
                       "ORDER BY embedding <=> %(q)s LIMIT 40", {"q": query.astype(np.float32)})
    assert user_index_name("distillations", "alice") in plan

    rng = np.random.default_rng(3)
    for threshold, limit, gate, leg_size in ((0.7, 5, True, 50), (0.3, 10, True, 20), (0.0, 25, False, 50),
                                              (0.9, 3, False, 10)):
        for q in (query, query + rng.normal(size=384) * 0.02):
            params = RecallParams(threshold=threshold, limit=limit, gate=gate, leg_size=leg_size)
            got = _recall(conn, "alice", "kitten violin", q, params)
            exact = _recall(conn, "alice", "kitten violin", q, params, exact=True)
            assert [r.id for r in got] == [r.id for r in exact]
            assert [r.score for r in got] == pytest.approx([r.score for r in exact], rel=1e-12)
            if not gate:
                assert len(got) == limit

    # Both vector legs use the user's own index, and only ever return the user's rows.
    alice = {str(r[0]) for r in conn.execute("SELECT id FROM memories WHERE user_id = 'alice' "
                                             "UNION ALL SELECT id FROM distillations WHERE user_id = 'alice'")}
    for table in ("memories", "distillations"):
        hits = vector_search(conn, table=table, user_id="alice", query_embedding=query,  # type: ignore[arg-type]
                             embedding_model=MODEL, limit=10)
        exact_hits = vector_search(conn, table=table, user_id="alice", query_embedding=query,  # type: ignore[arg-type]
                                   embedding_model=MODEL, limit=10, exact=True)
        assert [h.id for h in hits] == [h.id for h in exact_hits] and {h.id for h in hits} <= alice

    # Forgetting most of a user's rows drops their index at the next maintenance run.
    conn.execute("UPDATE distillations SET deleted_at = now() WHERE user_id = 'bob'")
    ensure_user_indexes(conn, min_rows=100, concurrently=False)
    assert not has_user_index(conn, "distillations", "bob") and has_user_index(conn, "memories", "bob")


def test_the_shared_index_path_equals_the_exact_scan(conn: psycopg.Connection,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """No index of their own: the shared HNSW index, with its beam widened for the user's share."""
    import yak_pipeline.store.recall as recall_module

    query = _seed(conn, "dan", 41, 200, exchange_vectors=True)
    _seed(conn, "erin", 42, 400, exchange_vectors=True)
    conn.execute("ANALYZE distillations")
    conn.execute("ANALYZE memories")
    monkeypatch.setattr(recall_module, "EXACT_SCAN_MAX_ROWS", 20)  # take the index path on this small table
    beams: list[int] = []
    set_beam = recall_module.set_beam
    monkeypatch.setattr(recall_module, "set_beam", lambda c, ef: (beams.append(ef), set_beam(c, ef))[1])
    for limit, leg_size in ((5, 20), (10, 40)):
        params = RecallParams(gate=False, limit=limit, leg_size=leg_size)
        beams.clear()
        got = _recall(conn, "dan", "garden coffee", query, params)
        assert len(beams) == 2 and min(beams) >= leg_size * 600 / 200  # both vector legs, beam widened for dan's third
        exact = _recall(conn, "dan", "garden coffee", query, params, exact=True)
        assert [r.id for r in got] == [r.id for r in exact]


def test_concurrent_index_builds_need_autocommit(conn: psycopg.Connection) -> None:
    with pytest.raises(ValueError):
        ensure_user_indexes(conn, min_rows=1)


def test_ties_break_on_id_in_every_leg_and_in_the_ranking(conn: psycopg.Connection) -> None:
    """Thirty rows equal in every signal: each leg keeps the smallest ids, and so does the ranking.

    (Each exchange is its own conversation, so their BM25 ties too; the relevance is constant, so a
    candidate that only some legs proposed does not stand out.)"""
    vector = np.ones(384, dtype=np.float32) / np.sqrt(384)
    with conn.cursor() as cur:
        for i in range(30):
            cur.execute(
                """WITH m AS (INSERT INTO memories (user_id, content, source, content_sha256, status, occurred_at)
                              VALUES ('tie', %(c)s, 'import', encode(sha256(convert_to(%(c)s, 'UTF8')), 'hex'),
                                      'distilled', %(at)s) RETURNING id)
                   INSERT INTO distillations (memory_id, user_id, content, confidence, tier, warmth, status,
                                              embedding, embedding_model, prompt_version, refreshed_at)
                   SELECT id, 'tie', %(c)s, 0.9, 'medium', 0.5, 'active', %(e)s, %(model)s, 't', %(t)s FROM m""",
                {"c": f"same fact {i:02d}", "e": vector, "model": MODEL, "t": NOW - timedelta(days=3),
                 "at": NOW - timedelta(days=3 + i)})
    ids = sorted(str(r[0]) for r in conn.execute("SELECT id FROM distillations WHERE user_id = 'tie'"))
    constant = RelevanceModel(embedding_model=MODEL, version="constant", bias=1.0, weights={})
    for leg_size in (50, 10):
        params = RecallParams(gate=False, limit=5, leg_size=leg_size)
        got = _recall(conn, "tie", "same fact", vector, params, model=constant)
        want = _recall(conn, "tie", "same fact", vector, params, exact=True, model=constant)
        candidates = recall_candidates(conn, user_id="tie", query="same fact", query_embedding=vector,
                                       embedding_model=MODEL, params=params)
        assert len({c.signals.bm25_distillation for c in candidates if "distillation_text" in c.ranks}) == 1
        if leg_size == 10:  # the distillation legs proposed the ten smallest ids
            assert sorted(c.id for c in candidates if "distillation_text" in c.ranks) == ids[:10]
        assert [r.id for r in got] == [r.id for r in want] == ids[:5]
        assert len({r.score for r in got}) == 1


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
    # The seeded exchanges had no vectors yet: the command embeds that backlog too, alone and in context.
    with database.connection() as conn:
        live = conn.execute("SELECT count(*) FROM memories WHERE deleted_at IS NULL").fetchone()[0]
    report = json.loads(built.stdout)
    assert report == {"built": report["built"], "contexts_rebuilt": None, "exchanges_embedded": live,
                      "contexts_embedded": live}
    # hal's distillation index was dropped; with their exchanges embedded now, heavy users get those indexed too.
    assert user_index_name("distillations", "hal") in report["built"]
    assert user_index_name("memories", "hal") in report["built"]
    with database.connection() as conn:
        assert conn.execute("SELECT count(*) FROM memories WHERE deleted_at IS NULL AND (embedding IS NULL "
                            "OR context_embedding IS NULL)").fetchone()[0] == 0
    again = cli.invoke(app, ["db", "index", "--min-rows", "10"])
    assert again.exit_code == 0 and "no user needs an index of their own" in again.output
    assert "embedded 0 exchanges and 0 exchange contexts" in again.output
    # The repair of exchange contexts (sql/006) recomputes every live exchange's.
    with database.connection() as conn:
        conn.execute("UPDATE memories SET context_tsv = NULL")
    repaired = cli.invoke(app, ["db", "index", "--min-rows", "10", "--rebuild-context", "--json"])
    assert repaired.exit_code == 0, repaired.output
    # Every context changed (from nothing), so every context vector is made again.
    assert json.loads(repaired.stdout) == {"built": [], "contexts_rebuilt": live, "exchanges_embedded": 0,
                                           "contexts_embedded": live} and live > 0
    with database.connection() as conn:
        assert conn.execute("SELECT count(*) FROM memories WHERE context_tsv IS NULL").fetchone()[0] == 0
    # Scheduled at 03:00 local time, one run a day.
    assert nightly_recall_index_schedule.cron_schedule == "0 3 * * *"
