"""The recall engine (store.recall): BM25 in SQL, the legs, merges, as_of, and the production path."""

from __future__ import annotations

import json
import math
import select
import time
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import psycopg
import pytest

from yak_pipeline.core.block_choice import BlockChoice, gathers
from yak_pipeline.core.query_intent import query_parts
from yak_pipeline.core.recall import RecallParams, interleave, rank_memories
from yak_pipeline.core.relevance import RelevanceModel
from yak_pipeline.core.scoring import decay_factor
from yak_pipeline.recall_models import RelevanceModelMissing, load_relevance_model
from yak_pipeline.services.exchange_embeddings import embed_pending_exchanges
from yak_pipeline.services.recall import build_context, recall_params, relevance_model, search_memories
from yak_pipeline.settings import Settings
from yak_pipeline.store.bm25 import BM25_B, BM25_K1, bm25_search
from yak_pipeline.store.database import Database, check_idle_connection
from yak_pipeline.store.distillations import add_version, mark_superseded_by_newer, set_distillation_status
from yak_pipeline.store.leg_runner import run_legs
from yak_pipeline.store.recall import recall, recall_candidates
from yak_pipeline.store.recallable_distillations import recallable_distillations, source_memories
from yak_pipeline.store.vector_legs import set_beam, vector_search
from yak_pipeline_tests.store_helpers import (
    EMBEDDER,
    idle_connections,
    recorded_statements,
    seed_memory_with_distillation,
)

NOW = datetime(2026, 6, 1, tzinfo=UTC)
MODEL = EMBEDDER.model_name
FITTED = load_relevance_model(MODEL)  # the shipped model for the hashing embedder

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
    conn.execute("UPDATE memories SET embedding = NULL")  # exchange vectors come from _embed_exchanges
    return ids


def _embed_exchanges(conn: psycopg.Connection) -> None:
    rows = conn.execute("SELECT id, content FROM memories WHERE embedding IS NULL").fetchall()
    for memory_id, content in rows:
        conn.execute("UPDATE memories SET embedding = %s, embedding_model = %s WHERE id = %s",
                     (np.asarray(EMBEDDER.embed_documents([content])[0], dtype=np.float32), MODEL, memory_id))


def _content(conn: psycopg.Connection, distillation_id: str) -> str:
    return conn.execute("SELECT content FROM distillations WHERE id = %s", (distillation_id,)).fetchone()[0]


def reference_bm25(conn: psycopg.Connection, table: str, user_id: str, query: str, *, column: str = "content_tsv",
                   model: str | None = None, as_of: datetime | None = None) -> dict[str, float]:
    """BM25 computed in Python from the stored tsvectors, to check the SQL's arithmetic.

    The corpus is the user's live rows of ``table`` (for distillations: active ones of ``model``),
    as of ``as_of`` (an exchange by when it occurred, a distillation by its exchange's time).
    """
    terms = {r[0] for r in conn.execute("SELECT lexeme FROM unnest(to_tsvector('english', %s))", (query,))}
    where = "t.user_id = %(user)s AND t.deleted_at IS NULL"
    if table == "distillations":
        where += (" AND t.status = 'active' AND t.embedding_model = %(model)s AND (%(as_of)s::timestamptz IS NULL "
                  "OR (SELECT m.occurred_at FROM memories m WHERE m.id = t.memory_id) <= %(as_of)s)")
    else:
        where += " AND (%(as_of)s::timestamptz IS NULL OR t.occurred_at <= %(as_of)s)"
    args = {"user": user_id, "model": model, "as_of": as_of}
    docs: dict[str, dict[str, int]] = {
        str(r[0]): {} for r in conn.execute(f"SELECT t.id FROM {table} t WHERE {where}", args)}  # noqa: S608
    lexemes = f"SELECT t.id, u.lexeme, u.positions FROM {table} t, unnest(t.{column}) u WHERE {where}"  # noqa: S608
    for row_id, lexeme, positions in conn.execute(lexemes, args):
        docs[str(row_id)][lexeme] = max(len(positions or ()), 1)
    if not docs:
        return {}
    n = len(docs)
    avgdl = sum(len(d) for d in docs.values()) / n
    df = Counter(t for d in docs.values() for t in d if t in terms)
    scores = {}
    for row_id, tf in docs.items():
        matched = [t for t in tf if t in terms]
        if not matched:
            continue
        scores[row_id] = sum(
            math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
            * tf[t] * (BM25_K1 + 1) / (tf[t] + BM25_K1 * (1 - BM25_B + BM25_B * len(tf) / max(avgdl, 1)))
            for t in matched)
    return scores


# --- the legs -------------------------------------------------------------------------------------


def test_bm25_in_sql_equals_the_reference_formula_and_any_word_may_match(conn: psycopg.Connection) -> None:
    _seed(conn, "alice")
    _seed(conn, "bob", FACTS[:2])
    query = "Who teaches chemistry, and what is the kitten called?"
    hits = bm25_search(conn, table="memories", user_id="alice", query=query, limit=10)
    reference = reference_bm25(conn, "memories", "alice", query)
    assert {h.id for h in hits} == set(reference)
    assert len(hits) == 2  # OR semantics: neither row holds every word of the question
    for hit in hits:
        assert hit.score == pytest.approx(reference[hit.id], rel=1e-9)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    # The same over distillations (active rows of the active model) and over exchanges in context.
    conn.execute("UPDATE distillations SET status = 'review', confidence = 0.5 "
                 "WHERE content LIKE '%%kitten%%' AND user_id = 'alice'")
    for table, column, context in (("distillations", "content_tsv", False), ("memories", "context_tsv", True)):
        hits = bm25_search(conn, table=table, user_id="alice", query=query, limit=10,  # type: ignore[arg-type]
                           embedding_model=MODEL if table == "distillations" else None, context=context)
        reference = reference_bm25(conn, table, "alice", query, column=column, model=MODEL)
        assert {h.id for h in hits} == set(reference) and hits
        for hit in hits:
            assert hit.score == pytest.approx(reference[hit.id], rel=1e-9)
    assert len(bm25_search(conn, table="distillations", user_id="alice", query=query, limit=10,
                           embedding_model=MODEL)) == 1  # the kitten in review is no candidate


def test_bm25_sees_only_the_users_rows_and_nothing_for_stop_words(conn: psycopg.Connection) -> None:
    _seed(conn, "alice")
    bob = _seed(conn, "bob", FACTS[:1])
    hits = bm25_search(conn, table="memories", user_id="alice", query="kitten Miso", limit=10)
    assert hits and bob[0][0] not in {h.id for h in hits}
    mine = {str(r[0]) for r in conn.execute("SELECT id FROM memories WHERE user_id = 'alice'")}
    assert {h.id for h in hits} <= mine
    d_hits = bm25_search(conn, table="distillations", user_id="alice", query="kitten Miso", limit=10,
                         embedding_model=MODEL)
    assert d_hits and bob[0][1] not in {h.id for h in d_hits}
    assert bm25_search(conn, table="memories", user_id="alice", query="what is the", limit=10) == []
    assert bm25_search(conn, table="memories", user_id="alice", query="kitten", limit=0) == []
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
    import yak_pipeline.store.vector_legs as vector_legs

    # Force the index path on this small table (it scans exactly below the threshold).
    monkeypatch.setattr(vector_legs, "EXACT_SCAN_MAX_ROWS", 10)
    mine = {str(r[0]) for r in conn.execute("SELECT id FROM memories WHERE user_id = 'user1'")}
    overlaps = []
    for _ in range(10):
        q = rng.normal(size=384)
        approx = vector_search(conn, table="memories", user_id="user1", query_embedding=q, embedding_model=MODEL,
                               limit=10)
        exact = vector_search(conn, table="memories", user_id="user1", query_embedding=q, embedding_model=MODEL,
                              limit=10, exact=True)
        assert len(approx) == 10 and {h.id for h in approx} <= mine
        assert [h.score for h in exact] == sorted((h.score for h in exact), reverse=True)
        overlaps.append(len({h.id for h in approx} & {h.id for h in exact}) / 10)
    assert sum(overlaps) / len(overlaps) >= 0.9


def test_exchanges_stand_for_their_active_distillation_following_merges(conn: psycopg.Connection) -> None:
    ids = _seed(conn, "alice")
    (m_kitten, d_kitten), (m_sister, d_sister), (m_run, d_run), _, (m_camp, d_camp), _ = ids
    add_version(conn, d_kitten, content="User adopted a kitten called Miso; User's sister Anna teaches chemistry.",
                embedding=EMBEDDER.embed_query("kitten sister"), embedding_model=MODEL, reason="merged",
                merged_from=[d_sister], refreshed_at=NOW - timedelta(days=9))
    set_distillation_status(conn, d_sister, status="merged", action="merge")
    set_distillation_status(conn, d_run, status="review", action="review")
    mapping = recallable_distillations(conn, user_id="alice", memory_ids=[m_kitten, m_sister, m_run],
                                       embedding_model=MODEL)
    assert mapping == {m_kitten: d_kitten, m_sister: d_kitten}  # the one in review is never recalled
    assert source_memories(conn, distillation_ids=[d_kitten])[d_kitten] == {m_kitten, m_sister}
    assert recallable_distillations(conn, user_id="bob", memory_ids=[m_kitten], embedding_model=MODEL) == {}
    assert recallable_distillations(conn, user_id="alice", memory_ids=[m_kitten], embedding_model="other") == {}

    # A second merge: the chain is followed to the distillation that holds everything now.
    add_version(conn, d_camp, content="User went camping; has a kitten; sister teaches chemistry.",
                embedding=EMBEDDER.embed_query("camping kitten sister"), embedding_model=MODEL, reason="merged",
                merged_from=[d_kitten], refreshed_at=NOW - timedelta(days=9))
    set_distillation_status(conn, d_kitten, status="merged", action="merge")
    mapping = recallable_distillations(conn, user_id="alice", memory_ids=[m_kitten, m_sister, m_camp],
                                       embedding_model=MODEL)
    assert mapping == {m_kitten: d_camp, m_sister: d_camp, m_camp: d_camp}
    assert source_memories(conn, distillation_ids=[d_camp])[d_camp] == {m_camp, m_kitten, m_sister}

    # Recall: the words only the sister's exchange has find the distillation that absorbed it.
    query = "What does Anna teach in Leeds?"
    candidates = recall_candidates(conn, user_id="alice", query=query, query_embedding=EMBEDDER.embed_query(query),
                                   embedding_model=MODEL, params=RecallParams(), exact=True)
    by_id = {c.id: c for c in candidates}
    assert d_sister not in by_id and d_kitten not in by_id and d_run not in by_id
    assert by_id[d_camp].ranks.get("exchange_text") == 1
    assert by_id[d_camp].signals.bm25_exchange == by_id[d_camp].signals.best_bm25_exchange > 0


# --- recall ---------------------------------------------------------------------------------------


def test_recall_finds_words_only_the_exchange_kept(conn: psycopg.Connection) -> None:
    _seed(conn, "alice")
    _seed(conn, "mallory", [("I adopted a kitten called Miso too.", "User adopted a kitten called Miso.")])
    _embed_exchanges(conn)
    # "Leeds" survives in both; "badly" only in the exchange of the peanut memory. One shared word
    # is weak evidence that the hashing embedder's memories answer the question at all (its
    # answerability is under 0.7), so the query's threshold is lowered: this is about what the
    # legs find and how it ranks.
    params = RecallParams(threshold=0.5, limit=3)
    query = "Which thing affects me badly?"
    vector = EMBEDDER.embed_query(query)
    hits = recall(conn, user_id="alice", query=query, query_embedding=vector, embedding_model=MODEL,
                  params=params, model=FITTED, now=NOW)
    assert hits and _content(conn, hits[0].id) == "User is allergic to peanuts."
    assert hits[0].ranks.get("exchange_text") == 1 and "distillation_text" not in hits[0].ranks
    # The best lexical match of the query (ratio 1), at the query's lexical strength (one rare word).
    assert hits[0].features["text_exchange"] == pytest.approx(hits[0].features["lexical_strength"])
    assert 0.0 < hits[0].features["lexical_strength"] < 1.0 and hits[0].features["text_distillation"] == 0.0
    owners = {conn.execute("SELECT user_id FROM distillations WHERE id = %s", (h.id,)).fetchone()[0] for h in hits}
    assert owners == {"alice"}
    exact = recall(conn, user_id="alice", query=query, query_embedding=vector, embedding_model=MODEL,
                   params=params, model=FITTED, now=NOW, exact=True)
    assert [h.id for h in exact] == [h.id for h in hits]
    # Recall is rank_memories over the candidates, nothing more.
    candidates = recall_candidates(conn, user_id="alice", query=query, query_embedding=vector,
                                   embedding_model=MODEL, params=params, exact=True)
    assert rank_memories(candidates, model=FITTED, params=params, now=NOW) == exact


def _candidates_of(conn: psycopg.Connection, user_id: str, query: str) -> list:
    """Every candidate of ``query`` for ``user_id``, ungated (exact search)."""
    return recall_candidates(conn, user_id=user_id, query=query, query_embedding=EMBEDDER.embed_query(query),
                             embedding_model=MODEL, params=RecallParams(threshold=0.0, limit=6, gate=False),
                             exact=True)


def test_candidates_say_whether_they_hold_the_kind_of_thing_the_question_asks_for(conn: psycopg.Connection) -> None:
    moved, lovely, sister = (d for _, d in _seed(conn, "bob", [
        ("I moved to Porto in March 2024.", "User moved to Porto in March 2024."),
        ("Porto is lovely, the food is great.", "User finds porto lovely, the food is great."),
        ("My sister teaches chemistry, her name is Anna.", "User's sister is called Anna and teaches chemistry.")]))
    _embed_exchanges(conn)

    def marked(query: str) -> dict[str, bool]:
        return {c.id: c.signals.answer_kind for c in _candidates_of(conn, "bob", query)}

    # A date is asked for: "in March 2024" holds one, "lovely, the food is great" none.
    when = marked("When did I move to Porto, and is Porto lovely?")
    assert when[moved] and not when[lovely]
    # A name is asked for: "called Anna" holds one.
    assert marked("What is my sister called?")[sister]
    # Nothing in particular is asked for: no candidate is marked.
    assert not any(marked("Tell me about Porto and my sister").values())


def test_candidates_say_whether_they_tell_of_a_change_when_the_question_asks_about_the_present(
        conn: psycopg.Connection) -> None:
    (_, cycles), (_, scoots), (said_now, words) = _seed(conn, "carol", [
        ("I cycle to school on Valenbisi.", "User cycles to school on Valenbisi."),
        ("I bought a Vespa, so now I scoot to school.", "User bought a Vespa, so now they scoot to school."),
        ("Right now I'm stuck in traffic on the way to school.", "User is stuck in traffic.")])
    # The third exchange's distillation waits in review: its exchange is recalled as the user's own words.
    conn.execute("UPDATE distillations SET status = 'review', confidence = 0.5 WHERE id = %s", (words,))
    _embed_exchanges(conn)

    def marked(query: str) -> dict[str, bool]:
        return {c.id: c.signals.present_change for c in _candidates_of(conn, "carol", query)}

    now = marked("How do I get to school currently?")
    assert now[scoots] and not now[cycles]
    # The user's own words say "now" of the moment: not read (core.updates.tells_of_change).
    assert said_now in now and not now[said_now]
    # A question not about the present marks nothing.
    assert not any(marked("How did I get to school on Valenbisi?").values())


def test_recall_at_the_largest_exponent_with_a_steep_model_ranks_without_overflow(conn: psycopg.Connection) -> None:
    # YAK_RECALL_RELEVANCE_EXPONENT allows 100; with a model ten times as steep as the shipped
    # one the best memories' rank odds pass the largest float (e × logit > 709), where the score
    # computed as a product raised OverflowError and recall failed.
    _seed(conn, "alice")
    _embed_exchanges(conn)
    steep = replace(FITTED, bias=FITTED.bias * 10, weights={k: v * 10 for k, v in FITTED.weights.items()})
    query = "Which thing affects me badly, the peanuts?"
    params = RecallParams(threshold=0.0, limit=6, relevance_exponent=100.0, gate=False)
    hits = recall(conn, user_id="alice", query=query, query_embedding=EMBEDDER.embed_query(query),
                  embedding_model=MODEL, params=params, model=steep, now=NOW, exact=True)
    assert len(hits) == 6 and hits[0].log_rank_odds > 709
    assert _content(conn, hits[0].id) == "User is allergic to peanuts."
    assert [h.log_rank_odds for h in hits] == sorted((h.log_rank_odds for h in hits), reverse=True)
    assert all(math.isfinite(h.rank_odds) and 0.0 <= h.score <= 1.0 for h in hits)


def test_recall_abstains_when_nothing_is_relevant(conn: psycopg.Connection) -> None:
    _seed(conn, "alice")
    _embed_exchanges(conn)
    query = "quantum chromodynamics lattice gauge"
    vector = EMBEDDER.embed_query(query)
    never = RelevanceModel(embedding_model=MODEL, version="never", bias=-20.0, weights={})
    assert recall(conn, user_id="alice", query=query, query_embedding=vector, embedding_model=MODEL,
                  params=RecallParams(), model=never, now=NOW) == []
    # The candidates were there: only the gate kept them out.
    assert recall(conn, user_id="alice", query=query, query_embedding=vector, embedding_model=MODEL,
                  params=RecallParams(gate=False), model=never, now=NOW)
    assert recall(conn, user_id="alice", query=query, query_embedding=vector, embedding_model=MODEL,
                  params=RecallParams(limit=0), model=FITTED, now=NOW) == []
    assert recall(conn, user_id="nobody", query=query, query_embedding=vector, embedding_model=MODEL,
                  params=RecallParams(gate=False), model=FITTED, now=NOW) == []


def test_recall_refuses_a_relevance_model_of_another_embedder(conn: psycopg.Connection) -> None:
    other = load_relevance_model("all-MiniLM-L6-v2")
    with pytest.raises(ValueError, match="yak eval calibrate"):
        recall(conn, user_id="alice", query="x", query_embedding=EMBEDDER.embed_query("x"), embedding_model=MODEL,
               params=RecallParams(), model=other, now=NOW)
    with pytest.raises(RelevanceModelMissing, match="yak eval calibrate"):
        load_relevance_model("no-such-embedder")
    assert FITTED.embedding_model == MODEL


def test_production_recall_is_the_one_engine(settings: Settings, database: Database) -> None:
    with database.connection() as conn:
        _seed(conn, "alice")
    assert embed_pending_exchanges(database, EMBEDDER) == len(FACTS)
    assert embed_pending_exchanges(database, EMBEDDER) == 0  # nothing left to do
    query = "What is my sister's job in Leeds?"
    params = recall_params(settings, threshold=0.7, limit=3)
    model = relevance_model(settings, EMBEDDER)
    assert model == FITTED
    assert (params.relevance_exponent, params.superseded_factor, params.leg_size, params.exchange_context) == (
        settings.recall_relevance_exponent, settings.recall_superseded_factor, settings.recall_leg_size,
        settings.recall_exchange_context)
    hits = search_memories(database, EMBEDDER, user_id="alice", query=query, params=params, model=model, now=NOW)
    assert hits and hits[0].content == "User's sister Anna teaches chemistry in Leeds."
    with database.connection() as conn:
        expected = recall(conn, user_id="alice", query=query, query_embedding=EMBEDDER.embed_query(query),
                          embedding_model=MODEL, params=params, model=model, now=NOW)
    assert [h.id for h in hits] == [r.id for r in expected]
    assert [h.score for h in hits] == [r.score for r in expected]
    assert hits[0].explain() == {"why": list(hits[0].why), **expected[0].explain()} and hits[0].relevance >= 0.7
    assert list(hits[0].why[:-1]) == expected[0].reasons(NOW) and hits[0].why[-1] == "matched words: leeds"


def test_a_question_listing_things_gets_a_memory_of_each(settings: Settings, database: Database) -> None:
    """``core.query_intent.query_parts``: "Considering A and B" is recalled for A and for B too, interleaved."""
    with database.connection() as conn:
        _seed(conn, "alice")
    embed_pending_exchanges(database, EMBEDDER)
    query = "Considering my kitten Miso and the peanuts, what should I pack for the trip?"
    model = relevance_model(settings, EMBEDDER)
    whole_only = replace(recall_params(settings, threshold=0.0, limit=6), query_parts=False)
    parts = replace(whole_only, query_parts=True)
    found = search_memories(database, EMBEDDER, user_id="alice", query=query, params=parts, model=model, now=NOW)
    whole = search_memories(database, EMBEDDER, user_id="alice", query=query, params=whole_only, model=model, now=NOW)
    with database.connection() as conn:
        rankings = [recall(conn, user_id="alice", query=text, query_embedding=EMBEDDER.embed_query(text),
                           embedding_model=MODEL, params=whole_only, model=model, now=NOW, echo=query)
                    for text in (query, "my kitten Miso", "the peanuts")]
    # The whole question's best, then each part's best, and so on, each memory once.
    assert [h.id for h in found] == [r.id for r in interleave(rankings, 6)]
    assert [h.id for h in whole] == [r.id for r in rankings[0]]
    assert {"User adopted a grey kitten called Miso.", "User is allergic to peanuts."} <= {h.content for h in found[:3]}
    first = rankings[0]
    assert interleave([first[:2], first[1:3], []], 10) == first[:3]
    assert interleave([first[:2], first[2:3]], 2) == [first[0], first[2]]


def test_query_parts_names_the_listed_things() -> None:
    assert query_parts("Considering my form validation code, lazy loading setup, and GA4 tracking, how do I ship?") == [
        "my form validation code", "lazy loading setup", "GA4 tracking"]
    assert query_parts("How many days between when I logged 3,600 words and my deadline?") == [
        "when I logged 3,600 words", "my deadline"]
    assert query_parts("What is my sister's job in Leeds?") == [] and query_parts("Considering everything?") == []


def test_query_parts_of_a_question_that_gathers_over_topics() -> None:
    """A question that gathers names the topics it gathers over (the last list in it); the same
    words in a lookup, or a time window, name none."""
    assert query_parts("In my questions about tossing coins and rolling dice, how many calculations did I "
                       "try to confirm?") == ["tossing coins", "rolling dice"]
    assert query_parts("How many areas have I focused on improving based on my messages about my resume, "
                       "portfolio, and salary negotiation?") == ["my resume", "portfolio", "salary negotiation"]
    assert query_parts("How many times did I ask about hiking and cycling across my sessions?") == [
        "hiking", "cycling"]
    assert query_parts("What did I say about hiking and cycling?") == []  # a lookup, not a gathering
    assert query_parts("How many times did I mention my dog?") == []  # one topic
    assert query_parts("Where was John between August 11 and August 15 2023?") == []  # a time window
    assert query_parts("What did John and Tim discuss between 3 May and 10 June?") == []
    assert query_parts("How many weeks passed between Maria adopting Coco and Shadow?") == [
        "Maria adopting Coco", "Shadow"]


def test_a_question_that_gathers_gets_more_memories_newest_first(database: Database) -> None:
    """``core.block_choice.gathers``: "how many times …" gets every relevant memory up to the gather
    limit, with no odds gap, newest first; the same words asked as a lookup get the usual block."""
    with database.connection() as conn:
        ids = _seed(conn, "alice")  # FACTS[i] said 10 + i days ago: the last is the oldest
    params = RecallParams(threshold=0.0, limit=2)

    def block(query: str, choice: BlockChoice) -> list[str]:
        _, built = build_context(database, EMBEDDER, user_id="alice", query=query, params=params, model=FITTED,
                                 now=NOW, choice=choice)
        assert built.recall_error is None
        return built.recalled_ids

    said = {distillation: i for i, (_, distillation) in enumerate(ids)}
    gathered = block("How many times did I mention my sister, the kitten or the bread across my sessions?",
                     BlockChoice(gather_limit=4, token_budget=0))
    assert len(gathered) == 4
    assert [said[i] for i in gathered] == sorted(said[i] for i in gathered)  # newest (the lowest i) first
    assert len(block("Did I mention my sister, the kitten or the bread?", BlockChoice(odds_gap=None))) == 2
    # Off, or a question about the present ("how many … now"): the usual block.
    assert len(block("How many times did I mention my sister, the kitten or the bread across my sessions?",
                     BlockChoice(gather_limit=0, odds_gap=None))) == 2
    assert len(block("How many kittens do I have now?", BlockChoice(gather_limit=4, odds_gap=None))) == 2


def test_gathering_questions_are_read_from_their_words() -> None:
    assert gathers("How many different user roles did I mention across my sessions?", BlockChoice())
    assert gathers("In what order did I bring up the three frameworks?", BlockChoice())
    assert gathers("Can you summarise how my essay goals evolved?", BlockChoice())
    assert not gathers("How many columns does the table have now?", BlockChoice())  # the current value
    assert not gathers("What is my sister called?", BlockChoice())
    assert not gathers("How many times did I go?", BlockChoice(gather_limit=0))


# --- as_of ------------------------------------------------------------------------------------------

LISBON = ("I live in Lisbon, in a flat by the river.", "User lives in Lisbon.")
PORTO = ("I moved to Porto, my new flat is by the river too.", "User lives in Porto.")


def _lisbon_then_porto(conn: psycopg.Connection) -> tuple[str, str]:
    (_, lisbon), = _seed(conn, "alice", [LISBON], days_ago=30)
    (_, porto), = _seed(conn, "alice", [PORTO], days_ago=5)
    _embed_exchanges(conn)
    assert mark_superseded_by_newer(conn, lisbon, porto, actor="test", user_id="alice") == lisbon
    return lisbon, porto


def test_the_block_leaves_a_superseded_memory_out_unless_the_question_asks_about_the_past(
        database: Database) -> None:
    """Search lists both, the current first and the old one marked; the block holds only the current
    fact, unless the question asks what was true before, or recall is as of a past moment."""
    with database.connection() as conn:
        lisbon, porto = _lisbon_then_porto(conn)
    params = RecallParams(threshold=0.0, limit=10)
    hits = search_memories(database, EMBEDDER, user_id="alice", query="Where is my flat, which city?",
                           params=params, model=FITTED, now=NOW)
    assert [h.id for h in hits[:2]] == [porto, lisbon] and hits[1].superseded_by == porto

    def block(query: str, **ask: object) -> list[str]:
        # Every ranked memory (no odds gap): this is about supersession alone.
        text, built = build_context(database, EMBEDDER, user_id="alice", query=query, params=params, model=FITTED,
                                    now=NOW, choice=BlockChoice(odds_gap=None), **ask)
        assert built.recall_error is None
        return built.recalled_ids

    assert porto in block("Where is my flat, which city?") and lisbon not in block("Where is my flat, which city?")
    assert {porto, lisbon} <= set(block("Which city did I live in before?"))
    assert block("Where is my flat?", as_of=NOW - timedelta(days=10)) == [lisbon]  # current then


def _recall_as_of(conn: psycopg.Connection, as_of: datetime | None, query: str = "Where is my flat, which city?"):
    return recall(conn, user_id="alice", query=query, query_embedding=EMBEDDER.embed_query(query),
                  embedding_model=MODEL, params=RecallParams(gate=False, limit=10), model=FITTED, now=NOW,
                  as_of=as_of, exact=True)


def test_as_of_recalls_only_what_had_happened_by_then(conn: psycopg.Connection) -> None:
    lisbon, porto = _lisbon_then_porto(conn)
    assert {r.id for r in _recall_as_of(conn, None)} == {lisbon, porto}
    before_porto = NOW - timedelta(days=10)
    [only] = _recall_as_of(conn, before_porto)
    assert only.id == lisbon
    assert only.decay == pytest.approx(decay_factor(20, 30.0))  # aged from as_of, not from now
    # Neither the distillation legs nor the exchange legs see the later memory.
    query = "Porto"
    for table in ("memories", "distillations"):
        assert bm25_search(conn, table=table, user_id="alice", query=query, limit=5,  # type: ignore[arg-type]
                           embedding_model=MODEL, as_of=before_porto) == []
        hits = vector_search(conn, table=table, user_id="alice",  # type: ignore[arg-type]
                             query_embedding=EMBEDDER.embed_query(query), embedding_model=MODEL, limit=5,
                             as_of=before_porto, exact=True)
        assert len(hits) == 1
    assert _recall_as_of(conn, NOW - timedelta(days=60)) == []  # before anything happened


def test_supersession_counts_only_once_the_newer_memory_had_happened(conn: psycopg.Connection) -> None:
    lisbon, porto = _lisbon_then_porto(conn)
    now = {r.id: r for r in _recall_as_of(conn, None)}
    assert now[lisbon].superseded_by == porto and now[porto].superseded_by is None
    after = {r.id: r for r in _recall_as_of(conn, NOW - timedelta(days=1))}
    assert after[lisbon].superseded_by == porto
    # As of a day when only Lisbon had been said, Lisbon was current: not marked, not halved.
    [before] = _recall_as_of(conn, NOW - timedelta(days=10))
    assert before.id == lisbon and before.superseded_by is None
    odds = before.standing / (1 - before.standing)
    assert before.rank_odds == pytest.approx(odds ** RecallParams().relevance_exponent
                                             * before.decay * (1 + before.warmth) * before.gravity)


def test_supersession_as_of_goes_by_when_the_newer_memory_happened_not_when_it_was_refreshed(
        conn: psycopg.Connection) -> None:
    lisbon, porto = _lisbon_then_porto(conn)
    # Porto's distillation is edited by hand later (services.curation.write_manual_version: refreshed_at
    # becomes now()); it was *said* five days before NOW.
    add_version(conn, porto, content="User lives in Porto, Portugal.",
                embedding=EMBEDDER.embed_query("User lives in Porto, Portugal."), embedding_model=MODEL,
                reason="manual")
    as_of = {r.id: r for r in _recall_as_of(conn, NOW - timedelta(days=1))}
    assert set(as_of) == {lisbon, porto}  # Porto had happened by then: it is recalled ...
    assert as_of[lisbon].superseded_by == porto  # ... so Lisbon was no longer current


def test_an_embedder_without_a_fitted_relevance_model_is_a_one_line_error(tmp_path) -> None:  # noqa: ANN001
    from yak_pipeline.recall_models import RelevanceModelMissing, load_relevance_model, model_file_name, user_models_dir

    with pytest.raises(RelevanceModelMissing, match="yak eval calibrate") as refused:
        load_relevance_model("nomic-embed-text", home=tmp_path)
    assert "\n" not in str(refused.value)
    # A user's own fit for that embedder is found in $YAK_HOME/recall_models and wins.
    mine = FITTED.to_dict() | {"embedding_model": "nomic-embed-text", "version": "nomic-embed-text@mine"}
    user_models_dir(tmp_path).mkdir()
    (user_models_dir(tmp_path) / model_file_name("nomic-embed-text")).write_text(json.dumps(mine))
    assert load_relevance_model("nomic-embed-text", home=tmp_path).version == "nomic-embed-text@mine"
    # A malformed file is one line naming it.
    (user_models_dir(tmp_path) / model_file_name("nomic-embed-text")).write_text("{not json")
    with pytest.raises(ValueError, match="not a relevance model"):
        load_relevance_model("nomic-embed-text", home=tmp_path)


# --- the legs side by side --------------------------------------------------------------------------


def test_legs_side_by_side_give_what_one_after_another_gives(db_url: str) -> None:
    with Database(db_url, min_size=5, max_size=5) as db:  # five open connections: four can be spare
        with db.connection() as conn:
            _seed(conn, "alice")
            _seed(conn, "mallory", [("I adopted a kitten called Miso too.", "User adopted a kitten called Miso.")])
        embed_pending_exchanges(db, EMBEDDER)
        query = "Which pet did I adopt, and what is my sister's job?"
        vector = EMBEDDER.embed_query(query)
        params = RecallParams(threshold=0.5, limit=4)
        with db.connection() as conn, idle_connections(db, 4) as spare:
            assert len(spare) == 4 and all(c is not conn for c in spare)
            side_by_side = recall_candidates(conn, user_id="alice", query=query, query_embedding=vector,
                                             embedding_model=MODEL, params=params, spare=spare)
            one_by_one = recall_candidates(conn, user_id="alice", query=query, query_embedding=vector,
                                           embedding_model=MODEL, params=params)
            assert side_by_side and side_by_side == one_by_one
            assert {c.id for c in side_by_side} <= {
                str(r[0]) for r in conn.execute("SELECT id FROM distillations WHERE user_id = 'alice'")}
            assert recall(conn, user_id="alice", query=query, query_embedding=vector, embedding_model=MODEL,
                          params=params, model=FITTED, now=NOW, spare=spare[:1]) == recall(
                conn, user_id="alice", query=query, query_embedding=vector, embedding_model=MODEL, params=params,
                model=FITTED, now=NOW)


def test_the_text_legs_run_while_the_query_vector_is_still_coming(conn: psycopg.Connection) -> None:
    """``query_embedding`` may be a call (a Future's ``result``): the BM25 legs are sent before it is
    asked for, it is asked for once, and the candidates are those of the vector given outright."""
    _seed(conn, "alice")
    query = "Which pet did I adopt, and what is my sister's job?"
    vector = EMBEDDER.embed_query(query)
    params = RecallParams(threshold=0.5, limit=4)
    asked: list[list[str]] = []  # what had been sent each time the vector was asked for
    with recorded_statements(conn) as sent:

        def coming() -> list[float]:
            asked.append([text for text, _ in sent])
            return vector

        later = recall_candidates(conn, user_id="alice", query=query, query_embedding=coming,
                                  embedding_model=MODEL, params=params)
    assert len(asked) == 1
    assert sum("bm25_postings" in statement for statement in asked[0]) == 2  # both text legs, before it
    assert not any("<=>" in statement for statement in asked[0])  # no vector leg yet
    assert later and later == recall_candidates(conn, user_id="alice", query=query, query_embedding=vector,
                                                embedding_model=MODEL, params=params)


def test_idle_connection_lends_only_what_is_free_and_a_failing_leg_fails_the_recall(db_url: str) -> None:
    with Database(db_url, min_size=2, max_size=2) as db:
        with db.connection() as conn:
            with idle_connections(db, 3) as spare:
                assert len(spare) == 1  # the pool holds two; the caller has one
                with idle_connections(db, 2) as none_left, db.idle_connection() as none:
                    assert none_left == [] and none is None  # never waits for a connection in use
                results = run_legs(conn, [lambda c: c.execute("SELECT 1").fetchone()[0],
                                           lambda c: c.execute("SELECT 2").fetchone()[0],
                                           lambda c: c.execute("SELECT 3").fetchone()[0]], spare)
                assert results == [1, 2, 3]  # in the legs' order, whichever connection ran each
        with db.connection() as conn, idle_connections(db, 1) as spare:
            with pytest.raises(psycopg.errors.UndefinedColumn):
                run_legs(conn, [lambda c: c.execute("SELECT pg_sleep(0.05)"),
                                 lambda c: c.execute("SELECT no_such_column")], spare)


def test_helpers_borrow_their_own_connections_and_give_them_back(db_url: str) -> None:
    """Lenders (``Database.idle_connection``): each helper thread borrows one if the pool has one free,
    runs legs on it, and gives it back; a helper that finds none leaves its legs to the others."""
    with Database(db_url, min_size=2, max_size=2) as db:
        backend = "SELECT pg_backend_pid()"
        with db.connection() as conn:
            mine = conn.execute(backend).fetchone()[0]
            # Two lenders, one connection free: the legs run on the caller's and at most one more.
            pids = run_legs(conn, [lambda c: (c.execute("SELECT pg_sleep(0.05)"), c.execute(backend).fetchone()[0])[1]
                                    for _ in range(4)], [db.idle_connection] * 2)
            assert len(pids) == 4 and mine in pids and len(set(pids)) <= 2
            with pytest.raises(psycopg.errors.UndefinedColumn):
                run_legs(conn, [lambda c: c.execute("SELECT pg_sleep(0.05)"),
                                 lambda c: c.execute("SELECT no_such_column")], [db.idle_connection])
            conn.rollback()  # the failed leg may have run on this connection
        # Every borrowed connection came back: the pool lends both again, at once.
        deadline = time.monotonic() + 5
        while db._pool.get_stats().get("pool_available", 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        with db.connection() as conn, db.idle_connection() as other:
            assert other is not None and other is not conn


def test_a_pooled_connection_whose_server_went_away_is_not_handed_out(db_url: str) -> None:
    """The pool's check skips the round trip for an idle connection with nothing to read, and
    catches one the server closed (its goodbye makes the socket readable)."""
    with Database(db_url, min_size=1, max_size=1) as db:
        with db.connection() as pooled:
            first = pooled.execute("SELECT pg_backend_pid()").fetchone()[0]
        check_idle_connection(pooled)  # alive, back in the pool: no error
        with psycopg.connect(db_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (first,))
        goodbye = select.poll()
        goodbye.register(pooled.fileno(), select.POLLIN)
        assert goodbye.poll(5000)  # the server's goodbye has arrived (the backend ends asynchronously)
        with pytest.raises(psycopg.OperationalError):
            check_idle_connection(pooled)
        with db.connection() as conn:  # the pool noticed and opened a new one
            assert conn.execute("SELECT pg_backend_pid()").fetchone()[0] != first


def test_recall_connections_in_autocommit_still_set_the_beam_and_go_back_transactional(db_url: str) -> None:
    """Recall reads in autocommit mode (no BEGIN, no COMMIT): the beam set in a pipeline holds for the
    search sent with it, and only for it, and the pool lends the connection back in transactions."""
    with Database(db_url, min_size=1, max_size=1) as db:
        with db.connection(autocommit=True) as conn:
            assert conn.autocommit
            with conn.pipeline():
                set_beam(conn, 123, iterative=False)
                inside = conn.execute("SELECT current_setting('hnsw.ef_search'), current_setting('hnsw.iterative_scan')")
            assert inside.fetchone() == ("123", "off")
            assert conn.execute("SHOW hnsw.ef_search").fetchone()[0] != "123"  # that transaction has ended
            same = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        with db.connection() as conn:
            assert not conn.autocommit and conn.execute("SELECT pg_backend_pid()").fetchone()[0] == same
            conn.execute("SELECT 1")
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        with db.idle_connection(autocommit=True) as lent:
            assert lent is not None and lent.autocommit
        with db.connection() as conn:
            assert not conn.autocommit
