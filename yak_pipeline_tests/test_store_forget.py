"""Forget leaves no row that references the forgotten memory, and no read path returns its text."""

from __future__ import annotations

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from yak_pipeline.store.distillations import add_version, list_distillations, list_versions, set_distillation_status
from yak_pipeline.store.forget import find_forget_candidates, forget_memories, resolve_memory_ids
from yak_pipeline.store.turns import insert_turn
from yak_pipeline.store.warmth import apply_relevance, warmth_history
from yak_pipeline_tests.store_helpers import EMBEDDER, seed_memory_with_distillation


def _references(conn: psycopg.Connection, memory_ids: list[str], distillation_ids: list[str]) -> dict[str, int]:
    """Rows in every table (but the audit log, which keeps ids by design) that point at the forgotten."""
    q = {
        "memories": ("SELECT count(*) FROM memories WHERE id = ANY(%(m)s::uuid[])"),
        "distillations": ("SELECT count(*) FROM distillations WHERE memory_id = ANY(%(m)s::uuid[]) OR id = ANY(%(d)s::uuid[])"),
        "distillation_versions": ("SELECT count(*) FROM distillation_versions WHERE distillation_id = ANY(%(d)s::uuid[]) "
                                  "OR merged_from && %(d)s::uuid[]"),
        "conflicts": ("SELECT count(*) FROM conflicts WHERE distillation_a = ANY(%(d)s::uuid[]) "
                      "OR distillation_b = ANY(%(d)s::uuid[])"),
        "turns": ("SELECT count(*) FROM turns WHERE memory_id = ANY(%(m)s::uuid[]) OR recalled_ids && %(d)s::uuid[]"),
        "warmth_events": ("SELECT count(*) FROM warmth_events WHERE distillation_id = ANY(%(d)s::uuid[])"),
    }
    return {table: conn.execute(sql, {"m": memory_ids, "d": distillation_ids}).fetchone()[0] for table, sql in q.items()}


def _text_visible(conn: psycopg.Connection, token: str) -> int:
    pattern = f"%{token}%"
    return conn.execute(
        """SELECT (SELECT count(*) FROM memories WHERE content LIKE %(p)s)
                + (SELECT count(*) FROM distillations WHERE content LIKE %(p)s)
                + (SELECT count(*) FROM distillation_versions WHERE content LIKE %(p)s)
                + (SELECT count(*) FROM turns WHERE user_message LIKE %(p)s OR assistant_message LIKE %(p)s)""",
        {"p": pattern},
    ).fetchone()[0]


operations = st.lists(
    st.tuples(st.sampled_from(["ingest", "merge", "recall_turn", "conflict", "forget"]), st.integers(0, 50)),
    min_size=1,
    max_size=25,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations, soft=st.booleans())
def test_forget_leaves_nothing_behind(conn: psycopg.Connection, ops: list[tuple[str, int]], soft: bool) -> None:
    try:
        _check_forget(conn, ops, soft)
    finally:
        conn.rollback()  # each example starts from an empty database


def _check_forget(conn: psycopg.Connection, ops: list[tuple[str, int]], soft: bool) -> None:
    live: list[tuple[str, str, str]] = []  # (memory id, distillation id, token)
    forgotten_tokens: list[str] = []
    counter = 0
    for op, pick in ops:
        if op == "ingest" or not live:
            counter += 1
            token = f"tok{counter}x{len(ops)}"
            m, d = seed_memory_with_distillation(conn, user_id="alice", exchange=f"User: {token}\nAssistant: ok",
                                                 distillation=f"User mentioned {token}.")
            live.append((str(m), str(d), token))
            # Bob has the very same exchange: forgetting Alice's must never touch it.
            seed_memory_with_distillation(conn, user_id="bob", exchange=f"User: {token}\nAssistant: ok",
                                          distillation=f"User mentioned {token}.")
        elif op == "merge" and len(live) >= 2:
            older, newer = live[pick % len(live)], live[(pick + 1) % len(live)]
            current = conn.execute("SELECT content FROM distillations WHERE id = %s", (older[1],)).fetchone()[0]
            newer_text = conn.execute("SELECT content FROM distillations WHERE id = %s", (newer[1],)).fetchone()[0]
            merged = f"{current} {newer_text}"
            add_version(conn, older[1], content=merged, embedding=EMBEDDER.embed_query(merged),
                        embedding_model=EMBEDDER.model_name, reason="merged", merged_from=[newer[1]])
            set_distillation_status(conn, newer[1], status="merged")
        elif op == "recall_turn":
            ids = [d for _, d, _ in live[: pick % len(live) + 1]]
            turn = insert_turn(conn, user_id="alice", user_message="q", assistant_message="a", recalled_ids=ids)
            apply_relevance(conn, ids[0], relevance_score=0.9, reason="turn", turn_id=turn)
        elif op == "conflict" and len(live) >= 2:
            a, b = live[pick % len(live)][1], live[(pick + 1) % len(live)][1]
            if a != b:
                from yak_pipeline.store.conflicts import record_conflict

                record_conflict(conn, user_id="alice", a=a, b=b, score=0.8)
        elif op == "forget":
            memory_id, distillation_id, token = live.pop(pick % len(live))
            bob_before = conn.execute("SELECT count(*) FROM memories WHERE user_id = 'bob'").fetchone()[0]
            report = forget_memories(conn, user_id="alice", memory_ids=[memory_id], actor="test", soft=soft)
            assert report.memory_ids == [memory_id]
            forgotten_tokens.append(token)
            assert conn.execute("SELECT count(*) FROM memories WHERE user_id = 'bob'").fetchone()[0] == bob_before
            if not soft:
                assert _references(conn, [memory_id], [distillation_id]) == {
                    t: 0 for t in ("memories", "distillations", "distillation_versions", "conflicts", "turns",
                                   "warmth_events")}
    # No read path returns forgotten text (soft delete hides, hard delete removes).
    visible = [d["content"] for d in list_distillations(conn, user_id="alice", limit=1000)]
    for token in forgotten_tokens:
        assert not any(token in text for text in visible)
        for d in list_distillations(conn, user_id="alice", limit=1000):
            assert not any(token in v["content"] for v in list_versions(conn, d["id"]))
        assert find_forget_candidates(conn, user_id="alice", phrase=token) == []
        if not soft:
            # Bob's copy (memory, distillation, its first version) is all that is left of it.
            assert _text_visible(conn, token) == 3
    # Everything not forgotten is still there.
    for _, _, token in live:
        assert find_forget_candidates(conn, user_id="alice", phrase=token) != []
    audit = conn.execute("SELECT count(*) FROM audit_log WHERE action = 'forget'").fetchone()[0]
    assert audit == len(forgotten_tokens)


def test_forget_resolves_distillation_ids_and_ignores_other_users(conn: psycopg.Connection) -> None:
    m, d = seed_memory_with_distillation(conn, user_id="alice", exchange="User: I'm allergic to nuts\nAssistant: noted",
                                         distillation="User is allergic to nuts.")
    assert resolve_memory_ids(conn, user_id="alice", ids=[d]) == [str(m)]
    assert resolve_memory_ids(conn, user_id="bob", ids=[d, m]) == []
    report = forget_memories(conn, user_id="bob", memory_ids=[m], actor="test")
    assert report.memory_ids == []
    assert conn.execute("SELECT count(*) FROM memories").fetchone()[0] == 1


@pytest.mark.parametrize("phrase", ["100%", "a_b", "back\\slash"])
def test_phrase_search_treats_wildcards_literally(conn: psycopg.Connection, phrase: str) -> None:
    seed_memory_with_distillation(conn, user_id="alice", exchange="User: plain text\nAssistant: ok",
                                  distillation="User said plain text.")
    assert find_forget_candidates(conn, user_id="alice", phrase=phrase) == []


@pytest.mark.parametrize("soft", [False, True])
def test_forgetting_a_turn_takes_back_the_warmth_it_caused(conn: psycopg.Connection, soft: bool) -> None:
    """Issue 16.8: the memories a forgotten turn warmed are not left warmer with an empty history."""
    _, coffee = seed_memory_with_distillation(conn, user_id="alice", exchange="User: I love coffee.\nAssistant: ok",
                                              distillation="User loves coffee.")
    _, nurse = seed_memory_with_distillation(conn, user_id="alice", exchange="User: I'm a nurse.\nAssistant: ok",
                                             distillation="User is a nurse.")
    turn_memory, _ = seed_memory_with_distillation(
        conn, user_id="alice", exchange="User: What should I order?\nAssistant: A coffee.",
        distillation="User asked what to order.")
    turn = insert_turn(conn, user_id="alice", user_message="What should I order?", assistant_message="A coffee.",
                       recalled_ids=[coffee, nurse], memory_id=turn_memory)
    apply_relevance(conn, coffee, relevance_score=0.9, reason="turn", turn_id=turn)   # +0.1
    apply_relevance(conn, nurse, relevance_score=0.1, reason="turn", turn_id=turn)    # -0.2
    apply_relevance(conn, coffee, relevance_score=0.9, reason="manual")              # another cause: +0.1 stays
    warmth = dict(conn.execute("SELECT id, warmth FROM distillations WHERE id = ANY(%s::uuid[])",
                               ([str(coffee), str(nurse)],)).fetchall())
    assert warmth[coffee] == pytest.approx(0.7) and warmth[nurse] == pytest.approx(0.3)

    report = forget_memories(conn, user_id="alice", memory_ids=[turn_memory], actor="test", soft=soft)
    assert report.warmth_undone == 2
    warmth = dict(conn.execute("SELECT id, warmth FROM distillations WHERE id = ANY(%s::uuid[])",
                               ([str(coffee), str(nurse)],)).fetchall())
    assert warmth[coffee] == pytest.approx(0.6) and warmth[nurse] == pytest.approx(0.5)
    history = warmth_history(conn, coffee)
    assert history[0]["reason"] == "forgotten" and history[0]["delta"] == pytest.approx(-0.1)
    assert history[0]["turn_id"] is None and history[0]["evaluator"] == "test"
