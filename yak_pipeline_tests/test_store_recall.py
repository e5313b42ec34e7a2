"""The SQL recall equals the pure-Python reference ranking of every row (DESIGN §4)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import psycopg
from hypothesis import HealthCheck, given, settings, strategies as st

from yak_pipeline.core.scoring import RecallCandidate, rank_candidates
from yak_pipeline.store.recall import RecallParams, recall, recall_exact
from yak_pipeline_tests.store_helpers import EMBEDDER

NOW = datetime(2026, 6, 1, tzinfo=timezone.utc)
MODEL = EMBEDDER.model_name
TIERS = ("core", "medium", "low")


def _seed(conn: psycopg.Connection, user_id: str, seed: int, n: int) -> tuple[np.ndarray, list[RecallCandidate]]:
    """Insert n active distillations whose similarity to a query spans the whole range."""
    rng = np.random.default_rng(seed)
    query = rng.normal(size=384)
    query /= np.linalg.norm(query)
    candidates = []
    with conn.cursor() as cur:
        for i in range(n):
            # Mix the query with noise so similarities spread over [-1, 1] instead of clustering at 0.
            mix = rng.uniform(-0.3, 1.0)
            vector = mix * query + (1 - abs(mix)) * rng.normal(size=384) / np.sqrt(384) * 3
            vector = (vector / np.linalg.norm(vector)).astype(np.float32)
            tier = TIERS[int(rng.integers(3))]
            warmth = float(rng.uniform(0, 1))
            weight = float(rng.choice([1.0, 1.0, 0.5, 1.5, 3.0]))
            refreshed = NOW - timedelta(days=float(rng.uniform(0, 200)))
            cur.execute(
                """WITH m AS (INSERT INTO memories (user_id, content, source, content_sha256, status, occurred_at)
                              VALUES (%(u)s, %(c)s::text, 'import', encode(sha256(convert_to(%(c)s::text, 'UTF8')), 'hex'), 'distilled', %(t)s)
                              RETURNING id)
                   INSERT INTO distillations (memory_id, user_id, content, confidence, tier, warmth, user_weight,
                                              status, embedding, embedding_model, prompt_version, refreshed_at)
                   SELECT id, %(u)s, %(c)s, 0.9, %(tier)s, %(w)s, %(uw)s, 'active', %(e)s, %(model)s, 't', %(t)s
                   FROM m RETURNING id, 1 - (embedding <=> %(q)s)""",
                {"u": user_id, "c": f"fact {seed} {i}", "t": refreshed, "tier": tier, "w": warmth, "uw": weight,
                 "e": vector, "model": MODEL, "q": query.astype(np.float32)},
            )
            distillation_id, similarity = cur.fetchone()
            candidates.append(RecallCandidate(id=str(distillation_id), similarity=float(similarity), tier=tier,
                                              warmth=warmth, user_weight=weight, refreshed_at=refreshed))
    return query, candidates


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 260),
    limit=st.integers(1, 25),
    threshold=st.floats(0.0, 0.95),
    decay=st.booleans(),
)
def test_sql_recall_equals_reference_ranking_of_every_row(
    conn: psycopg.Connection, seed: int, n: int, limit: int, threshold: float, decay: bool
) -> None:
    try:
        _check_recall(conn, seed, n, limit, threshold, decay)
    finally:
        conn.rollback()  # each example starts from an empty database


def _check_recall(conn: psycopg.Connection, seed: int, n: int, limit: int, threshold: float, decay: bool) -> None:
    user_id = f"user-{seed}-{n}-{limit}"
    query, candidates = _seed(conn, user_id, seed, n)
    # Another user's rows, nearer to the query than anything, must never appear.
    _seed(conn, f"other-{seed}-{n}-{limit}", seed, 30)
    params = RecallParams(threshold=threshold, limit=limit, half_life_days=30.0, decay_enabled=decay)
    reference = rank_candidates(candidates, threshold=threshold, limit=limit, now=NOW, half_life_days=30.0,
                                decay_enabled=decay, core_multiplier=2.0)
    got = recall(conn, user_id=user_id, query_embedding=query, embedding_model=MODEL, params=params, now=NOW)
    exact = recall_exact(conn, user_id=user_id, query_embedding=query, embedding_model=MODEL, params=params, now=NOW)
    assert [r.id for r in got] == [r.id for r in reference]
    assert [r.id for r in exact] == [r.id for r in reference]
    assert all(abs(a.score - b.score) < 1e-9 for a, b in zip(got, reference))


def test_recall_ignores_other_models_and_inactive_rows(conn: psycopg.Connection) -> None:
    query, candidates = _seed(conn, "alice", 7, 20)
    conn.execute("UPDATE distillations SET status = 'review', confidence = 0.5 WHERE id = %s", (candidates[0].id,))
    conn.execute("UPDATE distillations SET embedding_model = 'other-model' WHERE id = %s", (candidates[1].id,))
    params = RecallParams(threshold=0.0, limit=50)
    ids = {r.id for r in recall(conn, user_id="alice", query_embedding=query, embedding_model=MODEL, params=params, now=NOW)}
    expected = rank_candidates(candidates[2:], threshold=0.0, limit=50, now=NOW, half_life_days=30.0)
    assert ids == {r.id for r in expected} and len(ids) > 0
    assert recall(conn, user_id="nobody", query_embedding=query, embedding_model=MODEL, params=params, now=NOW) == []
