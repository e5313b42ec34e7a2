"""The SQL recall equals the pure reference: ``core.recall.rank_memories`` over exactly gathered candidates.

On random small histories (merges, statuses, supersession, forgotten rows, exchange vectors of
the active model, another model or none, another user's rows) the production path
``store.recall.recall`` returns exactly ``rank_memories`` over ``recall_candidates(exact=True)``,
and those candidates carry the signals recomputed here in Python from the stored rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import numpy as np
import psycopg
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from yak_pipeline.core.recall import Candidate, RecallParams, rank_memories
from yak_pipeline.core.relevance import FEATURES, NON_NEGATIVE_FEATURES, RelevanceModel
from yak_pipeline.store.distillations import add_version, mark_superseded_by_newer, set_distillation_status
from yak_pipeline.store.forget import forget_memories
from yak_pipeline.store.recall import UNKNOWN_COSINE, recall, recall_candidates
from yak_pipeline_tests.store_helpers import EMBEDDER, seed_memory_with_distillation
from yak_pipeline_tests.test_recall_engine import FITTED, reference_bm25

NOW = datetime(2026, 6, 1, tzinfo=UTC)
MODEL = EMBEDDER.model_name
TIERS = ("core", "medium", "low")
WORDS = ("kitten", "sister", "chemistry", "canal", "peanuts", "camping", "lake", "bread", "violin", "garden",
         "Lisbon", "Porto", "teacher", "running", "allergic", "holiday", "piano", "football", "coffee", "train")


@dataclass
class History:
    """What the seeding did, so the reference can be computed without the recall code."""

    memory_of: dict[str, str] = field(default_factory=dict)  # distillation -> its own memory
    occurred: dict[str, datetime] = field(default_factory=dict)  # memory -> occurred_at
    held: dict[str, set[str]] = field(default_factory=dict)  # active distillation -> memories it stands for
    superseded_by: dict[str, str] = field(default_factory=dict)


def seed_history(conn: psycopg.Connection, user_id: str, seed: int, n: int) -> History:
    """n memories of ``user_id`` with distillations, then forgetting, review, merges and supersession."""
    rng = np.random.default_rng(seed)
    history = History()
    active: list[str] = []
    when = NOW - timedelta(days=float(rng.uniform(0, 100)))
    for i in range(n):
        # Some exchanges follow each other within minutes (one conversation: sql/006 contexts).
        when -= timedelta(minutes=float(rng.uniform(1, 20))) if rng.random() < 0.5 else \
            timedelta(days=float(rng.uniform(0.5, 20)))
        words = [str(w) for w in rng.choice(WORDS, size=int(rng.integers(1, 5)))]
        said = " ".join(words + [f"r{seed % 97}x{i}"])
        memory_id, distillation_id = seed_memory_with_distillation(
            conn, user_id=user_id, exchange=f"User: I said {said}.\nAssistant: Noted.",
            distillation="User " + " ".join(words[: max(1, len(words) - int(rng.integers(0, 2)))]) + ".",
            tier=TIERS[int(rng.integers(3))], occurred_at=when)
        m, d = str(memory_id), str(distillation_id)
        conn.execute("UPDATE distillations SET warmth = %s, user_weight = %s WHERE id = %s",
                     (float(rng.uniform(0, 1)), float(rng.choice([1.0, 1.0, 0.5, 1.5, 3.0])), d))
        kind = rng.random()  # the exchange's vector: the active model's, another model's, or none yet
        if kind < 0.6:
            vector = np.asarray(EMBEDDER.embed_documents([f"User: I said {said}."])[0], dtype=np.float32)
            conn.execute("UPDATE memories SET embedding = %s, embedding_model = %s WHERE id = %s", (vector, MODEL, m))
        elif kind < 0.75:
            conn.execute("UPDATE memories SET embedding = %s, embedding_model = 'other-model' WHERE id = %s",
                         (np.ones(384, dtype=np.float32), m))
        history.memory_of[d], history.occurred[m] = m, when
        if rng.random() < 0.1:
            conn.execute("UPDATE distillations SET embedding_model = 'other-model' WHERE id = %s", (d,))
        elif rng.random() < 0.1:
            set_distillation_status(conn, d, status="review", action="review")
        else:
            history.held[d] = {m}
            active.append(d)
    if active and rng.random() < 0.3:  # forget one (softly or not): its words leave every leg
        gone = active.pop(int(rng.integers(len(active))))
        forget_memories(conn, user_id=user_id, memory_ids=[history.memory_of[gone]], actor="test",
                        soft=bool(rng.random() < 0.5))
        del history.held[gone]
    for _ in range(int(rng.integers(0, 3))):  # merges, possibly chained
        if len(active) < 2:
            break
        source, target = (active[int(i)] for i in rng.choice(len(active), size=2, replace=False))
        content = conn.execute("SELECT string_agg(content, ' ') FROM distillations WHERE id = ANY(%s::uuid[])",
                               ([target, source],)).fetchone()[0]
        add_version(conn, target, content=content, embedding=EMBEDDER.embed_query(content), embedding_model=MODEL,
                    reason="merged", merged_from=[source], refreshed_at=history.occurred[history.memory_of[target]])
        set_distillation_status(conn, source, status="merged", action="merge")
        history.held[target] |= history.held.pop(source)
        active.remove(source)
    for _ in range(int(rng.integers(1, 4)) if len(active) >= 2 else 0):  # knowledge updates
        a, b = (active[int(i)] for i in rng.choice(len(active), size=2, replace=False))
        older = mark_superseded_by_newer(conn, a, b, actor="test", user_id=user_id)
        if older is not None:
            history.superseded_by[older] = b if older == a else a
    if history.superseded_by and rng.random() < 0.3:  # a superseder sent to review no longer counts
        newer = sorted(history.superseded_by.values())[0]
        set_distillation_status(conn, newer, status="review", action="review")
        history.held.pop(newer, None)
    return history


def _random_query(seed: int) -> str:
    rng = np.random.default_rng(seed + 1)
    return " ".join(str(w) for w in rng.choice(WORDS + ("the", "what", "did", "I"), size=int(rng.integers(1, 5))))


def reference_candidates(conn: psycopg.Connection, history: History, *, user_id: str, query: str,
                         as_of: datetime | None, context: bool) -> dict[str, dict[str, object]]:
    """Every signal of every candidate, computed here from the stored rows (legs larger than the data)."""
    def visible(memory_id: str) -> bool:
        return as_of is None or history.occurred[memory_id] <= as_of

    q = np.asarray(EMBEDDER.embed_query(query), dtype=np.float64)

    def cosine(vector: object) -> float:
        v = np.asarray(vector.to_numpy() if hasattr(vector, "to_numpy") else vector, dtype=np.float64)
        return float(v @ q / (np.linalg.norm(v) * np.linalg.norm(q)))

    rows = conn.execute(
        """SELECT d.id, d.tier, d.warmth, d.user_weight, d.refreshed_at, d.embedding FROM distillations d
           WHERE d.user_id = %s AND d.status = 'active' AND d.deleted_at IS NULL AND d.embedding_model = %s""",
        (user_id, MODEL)).fetchall()
    exchange_vectors = {str(i): e for i, e in conn.execute(
        "SELECT id, embedding FROM memories WHERE user_id = %s AND deleted_at IS NULL AND embedding_model = %s",
        (user_id, MODEL))}
    exchange_cos = {m: cosine(v) for m, v in exchange_vectors.items() if visible(m)}
    d_bm25 = reference_bm25(conn, "distillations", user_id, query, model=MODEL, as_of=as_of)
    # As of a past moment exchanges are searched alone (a stored context may hold later words).
    m_bm25 = reference_bm25(conn, "memories", user_id, query,
                            column="context_tsv" if context and as_of is None else "content_tsv",
                            as_of=as_of)
    expected: dict[str, dict[str, object]] = {}
    for d, tier, warmth, weight, refreshed, embedding in rows:
        d = str(d)
        assert d in history.held, "an active distillation the seeding does not know"
        if not visible(history.memory_of[d]):
            continue
        held = [m for m in history.held[d] if visible(m)]
        cos_x = [exchange_cos[m] for m in held if m in exchange_cos]
        newer = history.superseded_by.get(d)
        expected[d] = {
            "tier": tier, "warmth": float(warmth), "user_weight": float(weight), "refreshed_at": refreshed,
            "cos_distillation": cosine(embedding), "cos_exchange": max(cos_x) if cos_x else None,
            "bm25_distillation": d_bm25.get(d, 0.0), "bm25_exchange": max((m_bm25.get(m, 0.0) for m in held),
                                                                          default=0.0),
            "superseded_by": newer if newer in history.held and visible(history.memory_of[newer]) else None,
        }
    # Every exchange no active distillation holds, found by a leg (its vector or its words), is a raw
    # candidate: the user's words, its own cosine standing in for a distillation's.
    held_anywhere = set().union(*history.held.values())
    live = conn.execute("SELECT id::text, occurred_at FROM memories WHERE user_id = %s AND deleted_at IS NULL",
                        (user_id,)).fetchall()
    raw = {m: occurred for m, occurred in live
           if m not in held_anywhere and visible(m) and (m in exchange_cos or m in m_bm25)}
    known_d = [e["cos_distillation"] for e in expected.values()] + [exchange_cos[m] for m in raw if m in exchange_cos]
    best_d = max(known_d, default=None)
    best_x = max(exchange_cos.values(), default=None)
    # An exchange not embedded yet reads as the best known cosine (UNKNOWN_COSINE when none is known).
    stand_in = max((v for v in (best_d, best_x) if v is not None), default=UNKNOWN_COSINE)
    for m, occurred in raw.items():
        expected[m] = {
            "tier": "medium", "warmth": 0.5, "user_weight": 1.0, "refreshed_at": occurred,
            "cos_distillation": exchange_cos.get(m, stand_in), "cos_exchange": exchange_cos.get(m),
            "bm25_distillation": 0.0, "bm25_exchange": m_bm25.get(m, 0.0), "superseded_by": None, "raw": True,
        }
    best = {
        "best_cos_distillation": stand_in if best_d is None else best_d,
        "best_cos_exchange": best_x,
        "best_bm25_distillation": max(d_bm25.values(), default=0.0),
        "best_bm25_exchange": max(m_bm25.values(), default=0.0),
    }
    for e in expected.values():
        e.update(best)
    return expected


def _check_signals(got: list[Candidate], expected: dict[str, dict[str, object]]) -> None:
    assert {c.id for c in got} == set(expected)
    for c in got:
        e = expected[c.id]
        assert (c.tier, c.warmth, c.user_weight, c.refreshed_at, c.superseded_by) == (
            e["tier"], e["warmth"], e["user_weight"], e["refreshed_at"], e["superseded_by"])
        assert c.kind == ("raw" if e.get("raw") else "distilled") and c.signals.raw == bool(e.get("raw"))
        s = c.signals
        for name in ("cos_distillation", "cos_exchange", "best_cos_distillation", "best_cos_exchange"):
            value, want = getattr(s, name), e[name]
            assert (value is None) == (want is None), name
            if want is not None:
                assert value == pytest.approx(want, abs=1e-5), name  # pgvector sums in float4
        for name in ("bm25_distillation", "bm25_exchange", "best_bm25_distillation", "best_bm25_exchange"):
            assert getattr(s, name) == pytest.approx(e[name], rel=1e-9, abs=1e-12), name
        assert c.ranks, "every candidate was proposed by some leg"


models = st.builds(
    lambda bias, weights: RelevanceModel(embedding_model=MODEL, version="random", bias=bias, weights=weights),
    bias=st.floats(-3.0, 3.0),
    weights=st.fixed_dictionaries({}, optional={
        name: st.floats(0.0, 5.0) if name in NON_NEGATIVE_FEATURES else st.floats(-5.0, 5.0) for name in FEATURES}),
) | st.just(FITTED)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 30),
    limit=st.integers(1, 12),
    threshold=st.floats(0.0, 0.95),
    gate=st.booleans(),
    decay=st.booleans(),
    context=st.booleans(),
    leg_size=st.sampled_from([2, 5, 200]),
    as_of_days=st.none() | st.floats(0.0, 150.0),
    model=models,
)
def test_sql_recall_equals_the_reference_ranking_of_the_exact_candidates(
    conn: psycopg.Connection, seed: int, n: int, limit: int, threshold: float, gate: bool, decay: bool,
    context: bool, leg_size: int, as_of_days: float | None, model: RelevanceModel,
) -> None:
    try:
        user_id = f"user-{seed}-{n}"
        history = seed_history(conn, user_id, seed, n)
        seed_history(conn, f"other-{seed}", seed, 10)  # the same words and vectors, never recalled
        params = RecallParams(threshold=threshold, limit=limit, gate=gate, decay_enabled=decay,
                              exchange_context=context, leg_size=leg_size)
        as_of = None if as_of_days is None else NOW - timedelta(days=as_of_days)
        query = _random_query(seed)
        vector = EMBEDDER.embed_query(query)
        args = {"user_id": user_id, "query": query, "query_embedding": vector, "embedding_model": MODEL,
                "params": params, "as_of": as_of}
        exact = recall_candidates(conn, **args, exact=True)
        reference = rank_memories(exact, model=model, params=params, now=as_of or NOW)
        got = recall(conn, **args, model=model, now=NOW)
        event(f"candidates: {'some' if exact else 'none'}; recalled: {'some' if got else 'none'}")
        event(f"superseded candidate: {any(c.superseded_by for c in exact)}")
        event(f"merged candidate: {any(len(history.held.get(c.id, ())) > 1 for c in exact)}")
        assert [r.id for r in got] == [r.id for r in reference]
        assert [r.score for r in got] == pytest.approx([r.score for r in reference], rel=1e-12)
        assert all(r.explain() == g.explain() for r, g in zip(reference, got))
        if leg_size > n:  # every leg holds every row: the candidates are all of them
            event("signals checked against the Python reference")
            _check_signals(exact, reference_candidates(conn, history, user_id=user_id, query=query, as_of=as_of,
                                                       context=context))
    finally:
        conn.rollback()  # each example starts from an empty database


def test_recall_ignores_other_models_and_other_users_rows_and_recalls_unheld_exchanges_as_said(
        conn: psycopg.Connection) -> None:
    """Distillations in review, rejected or of another embedder are never recalled; the exchanges
    they came from are, as the user's own words (raw hits whose id is the exchange's)."""
    ids = []
    for i, word in enumerate(("kitten", "violin", "garden", "coffee")):
        _, d = seed_memory_with_distillation(conn, user_id="alice", exchange=f"User: my {word}.\nAssistant: ok",
                                             distillation=f"User has a {word}.",
                                             occurred_at=NOW - timedelta(days=i))
        ids.append(str(d))
    seed_memory_with_distillation(conn, user_id="bob", exchange="User: my kitten.\nAssistant: ok",
                                  distillation="User has a kitten.", occurred_at=NOW)
    conn.execute("UPDATE distillations SET status = 'review', confidence = 0.5 WHERE id = %s", (ids[0],))
    conn.execute("UPDATE distillations SET embedding_model = 'other-model' WHERE id = %s", (ids[1],))
    conn.execute("UPDATE distillations SET status = 'rejected', confidence = 0.5 WHERE id = %s", (ids[2],))
    query = "kitten violin garden coffee"
    params = RecallParams(gate=False, limit=50)
    got = recall(conn, user_id="alice", query=query, query_embedding=EMBEDDER.embed_query(query),
                 embedding_model=MODEL, params=params, model=FITTED, now=NOW)
    memory_of = {str(d): str(m) for d, m in conn.execute(
        "SELECT id, memory_id FROM distillations WHERE id = ANY(%s::uuid[])", (ids,)).fetchall()}
    assert {r.id: r.kind for r in got} == {ids[3]: "distilled", **{memory_of[d]: "raw" for d in ids[:3]}}
    assert recall(conn, user_id="nobody", query=query, query_embedding=EMBEDDER.embed_query(query),
                  embedding_model=MODEL, params=params, model=FITTED, now=NOW) == []


def test_recall_as_of_before_a_merge_target_existed_finds_nothing_rather_than_failing(conn: psycopg.Connection) -> None:
    """An exchange merged, later, into a distillation whose own exchange came after ``as_of``: the
    exchange is found by its words, but what holds it now had not been said then. No candidate,
    not a crash (hypothesis found this; ``max()`` of no candidate rows raised)."""
    early, late = NOW - timedelta(days=20), NOW - timedelta(days=10)
    _, source = seed_memory_with_distillation(conn, user_id="alice", exchange="User: my violin lesson.\nAssistant: ok",
                                              distillation="User takes violin lessons.", occurred_at=early)
    _, target = seed_memory_with_distillation(conn, user_id="alice", exchange="User: my garden.\nAssistant: ok",
                                              distillation="User has a garden.", occurred_at=late)
    content = "User has a garden. User takes violin lessons."
    add_version(conn, str(target), content=content, embedding=EMBEDDER.embed_query(content), embedding_model=MODEL,
                reason="merged", merged_from=[str(source)], refreshed_at=late)
    set_distillation_status(conn, str(source), status="merged", action="merge")
    query, params = "violin lesson", RecallParams(gate=False, limit=10)
    ask = {"user_id": "alice", "query": query, "query_embedding": EMBEDDER.embed_query(query),
           "embedding_model": MODEL, "params": params}
    between = early + timedelta(days=5)
    assert recall_candidates(conn, **ask, as_of=between) == []
    assert recall(conn, **ask, as_of=between, model=FITTED, now=NOW) == []
    # After the later exchange, the merged distillation holds the violin lesson and is found.
    assert [c.id for c in recall_candidates(conn, **ask, as_of=NOW)] == [str(target)]
