"""Hybrid recall (store.hybrid): BM25 in SQL, the legs, merges, fusion, and the production routing."""

from __future__ import annotations

import math
from collections import Counter
from datetime import datetime, timedelta, timezone

import numpy as np
import psycopg
import pytest

from yak_pipeline.core.scoring import recall_score
from yak_pipeline.services.recall import embed_pending_exchanges, recall_params, search_memories
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline.store.distillations import add_version, set_distillation_status
from yak_pipeline.store.hybrid import (
    BM25_B,
    BM25_K1,
    HybridCandidate,
    HybridParams,
    bm25_search,
    fuse,
    hybrid_recall,
    hybrid_recall_exact,
    recallable_distillations,
    source_memories,
    vector_search,
)
from yak_pipeline.store.recall import RecallParams, recall
from yak_pipeline_tests.store_helpers import EMBEDDER, seed_memory_with_distillation

NOW = datetime(2026, 6, 1, tzinfo=timezone.utc)
MODEL = EMBEDDER.model_name

FACTS = [
    ("I adopted a grey kitten called Miso last spring.", "User adopted a grey kitten called Miso."),
    ("My sister Anna teaches chemistry in Leeds.", "User's sister Anna teaches chemistry in Leeds."),
    ("I run along the canal every Sunday morning.", "User runs along the canal on Sundays."),
    ("I'm allergic to peanuts, badly.", "User is allergic to peanuts."),
    ("We went camping by the lake with the kids.", "User went camping by a lake with the kids."),
    ("I bake sourdough bread most weekends.", "User bakes sourdough bread on weekends."),
]


def _seed(conn: psycopg.Connection, user_id: str, facts=FACTS, *, days_ago: float = 10.0) -> list[tuple[str, str]]:
    ids = []
    for i, (said, fact) in enumerate(facts):
        memory_id, distillation_id = seed_memory_with_distillation(
            conn, user_id=user_id, exchange=f"User: {said}\nAssistant: Noted.", distillation=fact,
            occurred_at=NOW - timedelta(days=days_ago + i))
        ids.append((str(memory_id), str(distillation_id)))
    conn.execute("UPDATE memories SET embedding = NULL")  # exchange vectors come from the service below
    return ids


def _embed_exchanges(conn: psycopg.Connection) -> None:
    rows = conn.execute("SELECT id, content FROM memories WHERE embedding IS NULL").fetchall()
    for memory_id, content in rows:
        conn.execute("UPDATE memories SET embedding = %s, embedding_model = %s WHERE id = %s",
                     (np.asarray(EMBEDDER.embed_documents([content])[0], dtype=np.float32), MODEL, memory_id))


def _reference_bm25(conn: psycopg.Connection, user_id: str, query: str) -> dict[str, float]:
    """BM25 computed in Python from the stored tsvectors, to check the SQL's arithmetic."""
    terms = {r[0] for r in conn.execute("SELECT lexeme FROM unnest(to_tsvector('english', %s))", (query,))}
    docs: dict[str, dict[str, int]] = {}
    for memory_id, lexeme, positions in conn.execute(
            "SELECT m.id, u.lexeme, u.positions FROM memories m, unnest(m.content_tsv) u "
            "WHERE m.user_id = %s AND m.deleted_at IS NULL", (user_id,)):
        docs.setdefault(str(memory_id), {})[lexeme] = len(positions)
    n = len(docs)
    avgdl = sum(len(d) for d in docs.values()) / n
    df = Counter(t for d in docs.values() for t in d if t in terms)
    scores = {}
    for memory_id, tf in docs.items():
        matched = [t for t in tf if t in terms]
        if not matched:
            continue
        scores[memory_id] = sum(
            math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
            * tf[t] * (BM25_K1 + 1) / (tf[t] + BM25_K1 * (1 - BM25_B + BM25_B * len(tf) / avgdl))
            for t in matched)
    return scores


def test_bm25_in_sql_equals_the_reference_formula_and_any_word_may_match(conn: psycopg.Connection) -> None:
    _seed(conn, "alice")
    _seed(conn, "bob", FACTS[:2])
    query = "Who teaches chemistry, and what is the kitten called?"
    hits = bm25_search(conn, table="memories", user_id="alice", query=query, limit=10)
    reference = _reference_bm25(conn, "alice", query)
    assert {h.id for h in hits} == set(reference)
    assert len(hits) == 2  # OR semantics: neither row holds every word of the question
    for hit in hits:
        assert hit.score == pytest.approx(reference[hit.id], rel=1e-9)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_bm25_sees_only_the_users_rows_and_nothing_for_stop_words(conn: psycopg.Connection) -> None:
    _seed(conn, "alice")
    bob = _seed(conn, "bob", FACTS[:1])
    hits = bm25_search(conn, table="memories", user_id="alice", query="kitten Miso", limit=10)
    assert hits and bob[0][0] not in {h.id for h in hits}
    assert bm25_search(conn, table="memories", user_id="alice", query="what is the", limit=10) == []
    with pytest.raises(ValueError):
        bm25_search(conn, table="distillations", user_id="alice", query="kitten", limit=5)


def test_vector_search_index_path_agrees_with_the_exact_scan(conn: psycopg.Connection,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    with conn.cursor() as cur:
        for i in range(600):
            v = rng.normal(size=384).astype(np.float32)
            cur.execute(
                """INSERT INTO memories (user_id, content, source, content_sha256, embedding, embedding_model)
                   VALUES (%s, %s, 'import', encode(sha256(convert_to(%s, 'UTF8')), 'hex'), %s, %s)""",
                (f"user{i % 3}", f"User: row {i}\nAssistant: ok", f"row {i}", v / np.linalg.norm(v), MODEL))
    conn.execute("ANALYZE memories")
    import yak_pipeline.store.hybrid as hybrid_module

    # Force the index path on this small table (it scans exactly below the threshold).
    monkeypatch.setattr(hybrid_module, "EXACT_SCAN_MAX_ROWS", 10)
    overlaps = []
    for _ in range(10):
        q = rng.normal(size=384)
        approx = vector_search(conn, table="memories", user_id="user1", query_embedding=q, embedding_model=MODEL,
                               limit=10)
        exact = vector_search(conn, table="memories", user_id="user1", query_embedding=q, embedding_model=MODEL,
                              limit=10, exact=True)
        assert len(approx) == 10
        mine = {str(r[0]) for r in conn.execute("SELECT id FROM memories WHERE user_id = 'user1'")}
        assert {h.id for h in approx} <= mine
        overlaps.append(len({h.id for h in approx} & {h.id for h in exact}) / 10)
    assert sum(overlaps) / len(overlaps) >= 0.9


def test_exchanges_stand_for_their_active_distillation_following_merges(conn: psycopg.Connection) -> None:
    ids = _seed(conn, "alice")
    (m_kitten, d_kitten), (m_sister, d_sister), (m_run, d_run) = ids[:3]
    add_version(conn, d_kitten, content="User adopted a kitten called Miso; User's sister Anna teaches chemistry.",
                embedding=EMBEDDER.embed_query("kitten sister"), embedding_model=MODEL, reason="merged",
                merged_from=[d_sister], refreshed_at=NOW - timedelta(days=9))
    set_distillation_status(conn, d_sister, status="merged", action="merge")
    set_distillation_status(conn, d_run, status="review", action="review")
    mapping = recallable_distillations(conn, user_id="alice", memory_ids=[m_kitten, m_sister, m_run],
                                       embedding_model=MODEL)
    assert mapping == {m_kitten: d_kitten, m_sister: d_kitten}  # the one in review is never recalled
    assert source_memories(conn, distillation_ids=[d_kitten])[d_kitten] == {m_kitten, m_sister}


def test_fusion_relevance_is_one_when_first_everywhere_and_the_section_4_factors_apply() -> None:
    params = RecallParams(threshold=0.0, limit=5, half_life_days=30.0, decay_enabled=True)
    hybrid = HybridParams(rrf_k=1.0, relevance_exponent=1.0, exchange_weight=1.0)
    legs = {"distillation_text": 1, "distillation_vector": 1, "exchange_text": 1, "exchange_vector": 1}
    fresh = HybridCandidate("a", 0.5, "medium", 0.5, 1.0, NOW, legs)
    old_core = HybridCandidate("b", 0.5, "core", 0.5, 1.0, NOW - timedelta(days=30), {"exchange_text": 2})
    hits = fuse([old_core, fresh, HybridCandidate("c", 0.9, "low", 0.0, 1.0, NOW, {})], params, hybrid, NOW)
    assert [h.id for h in hits] == ["a", "b"]  # a candidate in no leg is not recalled
    assert hits[0].relevance == pytest.approx(1.0)
    expected_b = (1 / 3) / (4 / 2)  # rank 2 in one leg of four, each weighted 1, k = 1
    assert hits[1].relevance == pytest.approx(expected_b)
    assert hits[1].score == pytest.approx(recall_score(expected_b, age_days=30, warmth=0.5, tier="core",
                                                       user_weight=1.0, half_life_days=30.0))
    with pytest.raises(ValueError):
        HybridParams(rrf_k=0)
    with pytest.raises(ValueError):
        HybridParams(relevance_exponent=0)
    with pytest.raises(ValueError):
        fuse([], params, hybrid, NOW.replace(tzinfo=None))


def test_the_relevance_exponent_lets_relevance_outweigh_the_priors() -> None:
    params = RecallParams(threshold=0.0, limit=5, half_life_days=30.0, decay_enabled=True)
    # "top": first in the exchange-text leg, 30 days old; "fresh": third in it, today.
    top = HybridCandidate("top", 0.5, "medium", 0.0, 1.0, NOW - timedelta(days=30), {"exchange_text": 1})
    fresh = HybridCandidate("fresh", 0.5, "medium", 0.0, 1.0, NOW, {"exchange_text": 3})
    # Relevance 1/2 vs 1/4 (k = 1) against decay 0.5 vs 1: a tie at exponent 1 (broken by relevance) ...
    linear = fuse([fresh, top], params, HybridParams(relevance_exponent=1.0, exchange_weight=1.0), NOW)
    assert linear[0].score == pytest.approx(linear[1].score)
    # ... and with exponent 3 the better match wins by (2)^3 / 2 = 4x.
    cubed = fuse([fresh, top], params, HybridParams(relevance_exponent=3.0, exchange_weight=1.0), NOW)
    assert [h.id for h in cubed] == ["top", "fresh"]
    assert cubed[0].score == pytest.approx(4 * cubed[1].score)
    assert cubed[0].relevance == pytest.approx(((1 / 2) / (4 / 2)) ** 3)


def test_hybrid_recall_finds_words_only_the_exchange_kept(conn: psycopg.Connection) -> None:
    _seed(conn, "alice")
    _seed(conn, "mallory", [("I adopted a kitten called Miso too.", "User adopted a kitten called Miso.")])
    _embed_exchanges(conn)
    # "Leeds" survives in both; "badly" only in the exchange of the peanut memory.
    params = RecallParams(threshold=0.7, limit=3, hybrid=HybridParams())
    query = "Which thing affects me badly?"
    hits = hybrid_recall(conn, user_id="alice", query=query, query_embedding=EMBEDDER.embed_query(query),
                         embedding_model=MODEL, params=params, now=NOW)
    contents = [conn.execute("SELECT content FROM distillations WHERE id = %s", (h.id,)).fetchone()[0] for h in hits]
    assert contents[0] == "User is allergic to peanuts."
    assert hits[0].ranks.get("exchange_text") == 1 and "distillation_text" not in hits[0].ranks
    owners = {conn.execute("SELECT user_id FROM distillations WHERE id = %s", (h.id,)).fetchone()[0] for h in hits}
    assert owners == {"alice"}
    exact = hybrid_recall_exact(conn, user_id="alice", query=query, query_embedding=EMBEDDER.embed_query(query),
                                embedding_model=MODEL, params=params, now=NOW)
    assert [h.id for h in exact] == [h.id for h in hits]


def test_production_recall_routes_through_hybrid_when_the_setting_is_on(settings: Settings,
                                                                         database: Database) -> None:
    with database.connection() as conn:
        _seed(conn, "alice")
    assert embed_pending_exchanges(database, EMBEDDER) == len(FACTS)
    assert embed_pending_exchanges(database, EMBEDDER) == 0  # nothing left to do
    query = "What is my sister's job in Leeds?"
    on = recall_params(settings, threshold=0.7, limit=3)
    assert on.hybrid is not None and settings.hybrid_recall
    hits = search_memories(database, EMBEDDER, user_id="alice", query=query, params=on, now=NOW)
    assert hits and hits[0].content == "User's sister Anna teaches chemistry in Leeds."
    off = recall_params(settings.model_copy(update={"hybrid_recall": False}), threshold=0.0, limit=3)
    assert off.hybrid is None
    vector_hits = search_memories(database, EMBEDDER, user_id="alice", query=query, params=off, now=NOW)
    with database.connection() as conn:
        expected = recall(conn, user_id="alice", query_embedding=EMBEDDER.embed_query(query), embedding_model=MODEL,
                          params=off, now=NOW)
    assert [h.id for h in vector_hits] == [r.id for r in expected]
