"""Recall at scale (issues 5, 12): the index paths agree with the exact scan.

The vector legs go through the user's own HNSW index (store.user_indexes), or the shared one with
pgvector's iterative scan, when a user has many rows; ``recall(..., exact=True)`` scans every row
exactly and is the reference they must match.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import numpy as np
import psycopg
import pytest

from yak_pipeline.core.recall import RecallParams
from yak_pipeline.core.relevance import RelevanceModel
from yak_pipeline.store.recall import recall, recall_candidates
from yak_pipeline.store.user_indexes import VECTOR_COLUMNS, ensure_user_indexes, user_index_name, user_indexes
from yak_pipeline.store.vector_legs import vector_search
from yak_pipeline_tests.store_helpers import EMBEDDER, recorded_statements
from yak_pipeline_tests.test_recall_engine import FITTED

NOW = datetime(2026, 6, 1, tzinfo=UTC)
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


def _assert_recall_equals_the_exact_scan(conn: psycopg.Connection, user_id: str, query: np.ndarray) -> None:
    """Recall through the index path ranks as the exact scan does, gated or not, at the query and near it."""
    rng = np.random.default_rng(3)
    for threshold, limit, gate, leg_size in ((0.7, 5, True, 50), (0.3, 10, True, 20), (0.0, 25, False, 50),
                                              (0.9, 3, False, 10)):
        for q in (query, query + rng.normal(size=384) * 0.02):
            params = RecallParams(threshold=threshold, limit=limit, gate=gate, leg_size=leg_size)
            got = _recall(conn, user_id, "kitten violin", q, params)
            exact = _recall(conn, user_id, "kitten violin", q, params, exact=True)
            assert [r.id for r in got] == [r.id for r in exact]
            assert [r.score for r in got] == pytest.approx([r.score for r in exact], rel=1e-12)
            if not gate:
                assert len(got) == limit


def test_the_iterative_index_scan_of_heavy_users_equals_the_exact_scan(
        conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    import yak_pipeline.store.vector_legs as vector_legs

    query = _seed(conn, "alice", 11, 300, exchange_vectors=True)
    _seed(conn, "bob", 12, 300, exchange_vectors=True)
    _seed(conn, "carol", 13, 20, exchange_vectors=True)  # few rows: always scanned exactly
    conn.execute("ANALYZE distillations")
    conn.execute("ANALYZE memories")
    monkeypatch.setattr(vector_legs, "EXACT_SCAN_MAX_ROWS", 100)  # alice and bob take the index path
    # At a few hundred rows the planner rightly prefers sorting them all; at scale it takes the
    # index (docs/BENCHMARKS.md). Here it must, for the index path to be what is compared.
    conn.execute("SET enable_sort = off")

    # The shared HNSW index serves one user's rows: the iterative scan goes on past rows of others.
    with conn.transaction():
        vector_legs.set_beam(conn, 40)
        plan = _plan(conn, "SELECT id FROM distillations WHERE user_id = %(u)s AND status = 'active' "
                           "ORDER BY embedding <=> %(q)s LIMIT 40", {"u": "alice", "q": query.astype(np.float32)})
    assert "distillations_embedding_hnsw" in plan

    _assert_recall_equals_the_exact_scan(conn, "alice", query)

    # Both vector legs return only the user's rows, the same as the exact scan.
    alice = {str(r[0]) for r in conn.execute("SELECT id FROM memories WHERE user_id = 'alice' "
                                             "UNION ALL SELECT id FROM distillations WHERE user_id = 'alice'")}
    for table in ("memories", "distillations"):
        hits = vector_search(conn, table=table, user_id="alice", query_embedding=query,  # type: ignore[arg-type]
                             embedding_model=MODEL, limit=10)
        exact_hits = vector_search(conn, table=table, user_id="alice", query_embedding=query,  # type: ignore[arg-type]
                                   embedding_model=MODEL, limit=10, exact=True)
        assert [h.id for h in hits] == [h.id for h in exact_hits] and {h.id for h in hits} <= alice
    carol = vector_search(conn, table="distillations", user_id="carol", query_embedding=query,
                          embedding_model=MODEL, limit=40)
    assert len(carol) == 20  # all of hers, from the exact scan


def test_heavy_users_get_their_own_indexes_and_recall_through_them_equals_the_exact_scan(
        conn: psycopg.Connection) -> None:
    query = _seed(conn, "alice", 11, 300, exchange_vectors=True)
    _seed(conn, "bob", 12, 300, exchange_vectors=True)
    _seed(conn, "carol", 13, 20, exchange_vectors=True)  # too few rows for indexes of her own
    conn.execute("UPDATE memories SET context_embedding = embedding, context_embedding_model = embedding_model "
                 "WHERE user_id <> 'carol'")
    announced: list[tuple[str, str, str, int]] = []
    built = ensure_user_indexes(conn, min_rows=100, concurrently=False,
                                on_build=lambda *build: announced.append(build))
    # carol has too few rows, and no context vectors: none of her own.
    assert set(built) == {user_index_name(t, c, u) for t, c in VECTOR_COLUMNS for u in ("alice", "bob")}
    assert ("memories", "context_embedding", "alice", 300) in announced and len(announced) == len(built)
    assert ensure_user_indexes(conn, min_rows=100, concurrently=False) == []  # idempotent
    assert user_indexes(conn, "alice") == frozenset(VECTOR_COLUMNS)
    assert user_indexes(conn, "carol") == frozenset()
    conn.execute("ANALYZE distillations")
    conn.execute("ANALYZE memories")

    # Each leg of alice reads her own index: the planner proves its predicate from the literal.
    # The legs' statements are recorded as sent and explained.
    # At a few hundred rows the planner rightly prefers sorting them all (as in the test above).
    conn.execute("SET enable_sort = off")
    for table, column in VECTOR_COLUMNS:
        with conn.transaction():
            with recorded_statements(conn) as sent:
                vector_search(conn, table=table, user_id="alice", query_embedding=query, embedding_model=MODEL,  # type: ignore[arg-type]
                              limit=10, context=column == "context_embedding")
            reads = [(text, a) for text, a in sent if "ORDER BY t." in text and "LIMIT %(n)s" in text]
            assert len(reads) == 1
            plan = _plan(conn, *reads[0])  # the same beam, set in this transaction
        assert user_index_name(table, column, "alice") in plan, plan
    conn.execute("RESET enable_sort")

    _assert_recall_equals_the_exact_scan(conn, "alice", query)

    # A leg on her own index is prepared at its first run and keeps its generic plan: planned once
    # per connection, the same rows every time.
    exact_hits = vector_search(conn, table="memories", user_id="alice", query_embedding=query,
                               embedding_model=MODEL, limit=10, context=True, exact=True)
    for _ in range(3):
        hits = vector_search(conn, table="memories", user_id="alice", query_embedding=query,
                             embedding_model=MODEL, limit=10, context=True)
        assert [h.id for h in hits] == [h.id for h in exact_hits]
    vector_search(conn, table="memories", user_id="bob", query_embedding=query, embedding_model=MODEL, limit=10,
                  context=True)  # bob's first
    plans = conn.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                         "WHERE statement LIKE '%%ORDER BY t.context_embedding <=>%%' AND statement LIKE '%%''bob''%%'"
                         ).fetchall()
    assert plans == [(1, 0)]
    assert conn.execute("SHOW plan_cache_mode").fetchone()[0] == "auto"  # only that statement's

    # Her own index holds only her rows, and rows written after it was built.
    later = _seed(conn, "alice", 14, 5, exchange_vectors=True)
    hits = vector_search(conn, table="distillations", user_id="alice", query_embedding=later,
                         embedding_model=MODEL, limit=10)
    exact_hits = vector_search(conn, table="distillations", user_id="alice", query_embedding=later,
                               embedding_model=MODEL, limit=10, exact=True)
    assert [h.id for h in hits] == [h.id for h in exact_hits]
    alice = {str(r[0]) for r in conn.execute("SELECT id FROM distillations WHERE user_id = 'alice'")}
    assert {h.id for h in hits} <= alice

    # Her own index is read without the iterative scan (its beam is all hers). With most of her
    # distillations held back for review the beam holds fewer recallable rows than the leg wants,
    # and the exact scan stands in.
    held = [r[0] for r in conn.execute(
        "UPDATE distillations SET status = 'review' WHERE id IN (SELECT id FROM distillations "
        "WHERE user_id = 'alice' ORDER BY id LIMIT 290) RETURNING id")]
    conn.execute("SET enable_sort = off")  # the index path, as at scale
    with recorded_statements(conn) as sent:
        hits = vector_search(conn, table="distillations", user_id="alice", query_embedding=query,
                             embedding_model=MODEL, limit=10)
    conn.execute("RESET enable_sort")
    assert [("ORDER BY t.embedding <=>" in text, "ORDER BY similarity DESC" in text) for text, _ in sent
            if "LIMIT %(n)s" in text] == [(True, False), (False, True)]  # her index came up short
    exact_hits = vector_search(conn, table="distillations", user_id="alice", query_embedding=query,
                               embedding_model=MODEL, limit=10, exact=True)
    assert len(hits) == 10 and [h.id for h in hits] == [h.id for h in exact_hits]
    conn.execute("UPDATE distillations SET status = 'active' WHERE id = ANY(%s)", (held,))

    # Forgetting most of a user's rows drops their index at the next maintenance run; an invalid
    # leftover of an interrupted build is rebuilt.
    conn.execute("UPDATE distillations SET deleted_at = now() WHERE user_id = 'bob'")
    # Only a superuser may mark an index invalid as an interrupted build leaves it; the suite's run
    # against an external server (its database's owner) checks the rest.
    superuser = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0]
    if superuser:
        conn.execute("UPDATE pg_index SET indisvalid = false WHERE indexrelid = %s::regclass",
                     (user_index_name("memories", "embedding", "alice"),))
        assert user_indexes(conn, "alice") == frozenset(VECTOR_COLUMNS) - {("memories", "embedding")}
    rebuilt = ensure_user_indexes(conn, min_rows=100, concurrently=False)
    assert rebuilt == ([user_index_name("memories", "embedding", "alice")] if superuser else [])
    assert user_indexes(conn, "bob") == frozenset(VECTOR_COLUMNS) - {("distillations", "embedding")}
    assert user_indexes(conn, "alice") == frozenset(VECTOR_COLUMNS)


def test_the_nightly_recall_index_job_builds_them_concurrently(conn: psycopg.Connection, settings) -> None:
    import dagster as dg

    from yak_pipeline.defs.automation.jobs import recall_index_job
    from yak_pipeline.defs.resources import PostgresResource

    _seed(conn, "alice", 21, 60, exchange_vectors=True)
    _seed(conn, "bob", 22, 10, exchange_vectors=True)
    conn.commit()
    result = recall_index_job.execute_in_process(
        instance=dg.DagsterInstance.ephemeral(),
        resources={"postgres": PostgresResource.from_settings(settings)},
        run_config={"ops": {"maintain_recall_indexes_op": {"config": {"min_rows": 50}}}})
    assert result.success
    assert sorted(result.output_for_node("maintain_recall_indexes_op")) == sorted(
        [user_index_name("distillations", "embedding", "alice"), user_index_name("memories", "embedding", "alice")])
    assert user_indexes(conn, "alice") == {("distillations", "embedding"), ("memories", "embedding")}
    assert user_indexes(conn, "bob") == frozenset()


def test_concurrent_index_builds_need_autocommit(conn: psycopg.Connection) -> None:
    with pytest.raises(ValueError, match="autocommit"):
        ensure_user_indexes(conn, min_rows=1)


def test_the_shared_index_path_equals_the_exact_scan(conn: psycopg.Connection,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared HNSW index at a beam of four times the rows wanted, whatever the user's share: the
    iterative scan, not a beam sized for it, makes up for the rows of other users (dan has a third)."""
    import yak_pipeline.store.vector_legs as vector_legs

    query = _seed(conn, "dan", 41, 200, exchange_vectors=True)
    _seed(conn, "erin", 42, 400, exchange_vectors=True)
    conn.execute("ANALYZE distillations")
    conn.execute("ANALYZE memories")
    monkeypatch.setattr(vector_legs, "EXACT_SCAN_MAX_ROWS", 20)  # take the index path on this small table
    beams: list[int] = []
    set_beam = vector_legs.set_beam
    monkeypatch.setattr(vector_legs, "set_beam", lambda c, ef, **how: (beams.append(ef), set_beam(c, ef, **how))[1])
    for limit, leg_size in ((5, 20), (10, 40)):
        params = RecallParams(gate=False, limit=limit, leg_size=leg_size)
        beams.clear()
        got = _recall(conn, "dan", "garden coffee", query, params)
        assert beams == [max(4 * leg_size, 40)] * 2  # both vector legs, through the index
        exact = _recall(conn, "dan", "garden coffee", query, params, exact=True)
        assert [r.id for r in got] == [r.id for r in exact]


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


def test_yak_db_index_embeds_the_backlog_and_repairs_contexts(database, settings) -> None:
    from typer.testing import CliRunner

    from yak_pipeline.cli.main import app
    from yak_pipeline.cli.parts import CliParts

    with database.connection() as conn:
        _seed(conn, "fay", 31, 30)
        _seed(conn, "gus", 32, 5)
    cli = CliRunner()
    built = cli.invoke(app, ["db", "index", "--json"], obj=CliParts.of(settings))
    assert built.exit_code == 0, built.output
    # The seeded exchanges had no vectors yet: the command embeds that backlog, alone and in context.
    with database.connection() as conn:
        live = conn.execute("SELECT count(*) FROM memories WHERE deleted_at IS NULL").fetchone()[0]
        assert conn.execute("SELECT count(*) FROM memories WHERE deleted_at IS NULL AND (embedding IS NULL "
                            "OR context_embedding IS NULL)").fetchone()[0] == 0
    # 35 exchanges: nobody is heavy enough for indexes of their own (store.user_indexes).
    assert json.loads(built.stdout) == {"contexts_rebuilt": None, "exchanges_embedded": live,
                                        "contexts_embedded": live, "recall_indexes_built": []} and live == 35
    again = cli.invoke(app, ["db", "index"], obj=CliParts.of(settings))
    assert again.exit_code == 0 and "embedded 0 exchanges and 0 exchange contexts; built 0" in again.output
    # The repair of exchange contexts (sql/006) recomputes every live exchange's.
    with database.connection() as conn:
        conn.execute("UPDATE memories SET context_tsv = NULL")
    repaired = cli.invoke(app, ["db", "index", "--rebuild-context", "--json"], obj=CliParts.of(settings))
    assert repaired.exit_code == 0, repaired.output
    # Every context changed (from nothing), so every context vector is made again.
    assert json.loads(repaired.stdout) == {"contexts_rebuilt": live, "exchanges_embedded": 0,
                                           "contexts_embedded": live, "recall_indexes_built": []}
    with database.connection() as conn:
        assert conn.execute("SELECT count(*) FROM memories WHERE context_tsv IS NULL").fetchone()[0] == 0


def test_the_upgrade_drops_the_per_user_indexes_of_pgvector_0_6(conn: psycopg.Connection) -> None:
    """sql/010 removes what the retired nightly job built, and only that."""
    from yak_pipeline.store.migrations import SQL_DIR

    conn.execute("CREATE INDEX distillations_hnsw_user_0123456789abcdef ON distillations "
                 "USING hnsw (embedding vector_cosine_ops) WHERE user_id = 'fay'")
    conn.execute("CREATE INDEX memories_hnsw_user_fedcba9876543210 ON memories "
                 "USING hnsw (embedding vector_cosine_ops) WHERE user_id = 'fay'")
    conn.execute("CREATE INDEX distillations_hnsw_user_note ON distillations (user_id)")  # not one of them
    conn.execute((SQL_DIR / "010_iterative_index_scans.sql").read_text())
    left = {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE indexname LIKE '%%hnsw%%'")}
    assert left == {"distillations_embedding_hnsw", "memories_embedding_hnsw", "memories_context_embedding_hnsw",
                    "distillations_hnsw_user_note"}
