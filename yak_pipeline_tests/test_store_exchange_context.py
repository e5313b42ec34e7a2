"""Exchange context (sql/006, 008): each exchange searched with its conversation neighbours, kept by a trigger."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import psycopg
import pytest

from yak_pipeline.services.exchange_embeddings import embed_pending_contexts, embed_pending_exchanges
from yak_pipeline.services.recall import recall_params, relevance_model
from yak_pipeline.settings import Settings
from yak_pipeline.store.bm25 import bm25_search
from yak_pipeline.store.database import Database
from yak_pipeline.store.forget import forget_memories
from yak_pipeline.store.memories import insert_memory, new_exchange
from yak_pipeline.store.recall import recall, recall_candidates
from yak_pipeline_tests.store_helpers import EMBEDDER, seed_memory_with_distillation

T0 = datetime(2026, 3, 1, 14, 0, tzinfo=UTC)


def _insert(conn: psycopg.Connection, text: str, at: datetime, user: str = "ann") -> str:
    return str(insert_memory(conn, new_exchange(user_id=user, content=f"User: {text}\nAssistant: Noted.", source="import",
                                                occurred_at=at)).id)


def _lexemes(conn: psycopg.Connection, memory_id: str) -> set[str]:
    rows = conn.execute("SELECT unnest(tsvector_to_array(context_tsv)) FROM memories WHERE id = %s",
                        (memory_id,)).fetchall()
    return {r[0] for r in rows}


def _contexts(conn: psycopg.Connection) -> dict[str, str]:
    return {str(i): str(c) for i, c in conn.execute("SELECT id, context_tsv FROM memories WHERE deleted_at IS NULL")}


def test_context_holds_the_neighbours_in_arrival_order_within_the_conversation(conn: psycopg.Connection) -> None:
    # One imported session: every exchange has the same timestamp, so arrival order decides.
    first = _insert(conn, "How was the pottery workshop?", T0)
    second = _insert(conn, "Wonderful, I made a teapot.", T0)
    third = _insert(conn, "Glazing is next week.", T0)
    later = _insert(conn, "Tomorrow I fly to Lisbon.", T0 + timedelta(hours=5))  # another conversation
    other_user = _insert(conn, "Zebras are striped.", T0, user="bob")

    assert {"potteri", "workshop", "teapot"} <= _lexemes(conn, first)
    assert "glaze" not in _lexemes(conn, first)  # two away: not a neighbour
    assert {"potteri", "teapot", "glaze"} <= _lexemes(conn, second)
    assert {"teapot", "glaze"} <= _lexemes(conn, third) and "potteri" not in _lexemes(conn, third)
    # Five hours apart is another conversation; another user's exchange is never a neighbour.
    assert "lisbon" not in _lexemes(conn, third) and "glaze" not in _lexemes(conn, later)
    assert "zebra" not in _lexemes(conn, second) and "teapot" not in _lexemes(conn, other_user)


def test_forgetting_an_exchange_removes_its_words_from_its_neighbours(conn: psycopg.Connection) -> None:
    ids = [_insert(conn, text, T0 + timedelta(minutes=i)) for i, text in
           enumerate(["Morning!", "My PIN is hidden under the kettle.", "Anyway, what about lunch?", "Soup."])]
    assert "kettl" in _lexemes(conn, ids[0]) and "kettl" in _lexemes(conn, ids[2])

    forget_memories(conn, user_id="ann", memory_ids=[ids[1]], actor="test", soft=True)
    assert "kettl" not in _lexemes(conn, ids[0]) and "kettl" not in _lexemes(conn, ids[2])
    assert "lunch" in _lexemes(conn, ids[0])  # the gap closes: the neighbours now see each other

    forget_memories(conn, user_id="ann", memory_ids=[ids[2]], actor="test", soft=False)
    assert "lunch" not in _lexemes(conn, ids[0]) and "lunch" not in _lexemes(conn, ids[3])
    assert "soup" in _lexemes(conn, ids[0])


def test_rebuild_gives_the_contexts_the_trigger_keeps(conn: psycopg.Connection) -> None:
    for i, text in enumerate(["We hiked up Snowdon.", "The fog was thick.", "We saw nothing at the top.",
                              "Next time Scafell.", "Different day entirely."]):
        _insert(conn, text, T0 + timedelta(minutes=10 * i if i < 4 else 600))
    _insert(conn, "Bob's only exchange.", T0, user="bob")
    kept = _contexts(conn)
    conn.execute("UPDATE memories SET context_tsv = NULL")
    rebuilt = conn.execute("SELECT yak_rebuild_exchange_context()").fetchone()[0]
    assert rebuilt == 6
    assert _contexts(conn) == kept
    assert conn.execute("SELECT yak_rebuild_exchange_context('bob')").fetchone()[0] == 1


def test_a_reply_is_found_by_the_words_of_the_question_it_answers(conn: psycopg.Connection,
                                                                  settings: Settings) -> None:
    question, _ = seed_memory_with_distillation(
        conn, user_id="ann", exchange="User: Did you go to the LGBTQ support group?\nAssistant: Tell me more.",
        distillation="User asked about a support group.", occurred_at=T0)
    reply, reply_fact = seed_memory_with_distillation(
        conn, user_id="ann", exchange="User: Yes! It was so powerful, everyone was kind.\nAssistant: Lovely.",
        distillation="User found a meeting powerful and kind.", occurred_at=T0 + timedelta(minutes=1))
    for i in range(6):  # unrelated history, so the words have document frequencies to speak of
        seed_memory_with_distillation(conn, user_id="ann", exchange=f"User: Groceries list number {i}.\nAssistant: Ok.",
                                      distillation=f"User keeps grocery list {i}.",
                                      occurred_at=T0 - timedelta(days=i + 1))

    alone = bm25_search(conn, table="memories", user_id="ann", query="support group", limit=5)
    with_context = bm25_search(conn, table="memories", user_id="ann", query="support group", limit=5, context=True)
    assert [h.id for h in alone] == [str(question)]
    assert {h.id for h in with_context} == {str(question), str(reply)}

    params = recall_params(settings, threshold=0.0, limit=3)
    assert params.exchange_context  # on by default
    vector = EMBEDDER.embed_query("support group")
    args = {"user_id": "ann", "query": "support group", "query_embedding": vector,
            "embedding_model": EMBEDDER.model_name}
    on = {c.id: c for c in recall_candidates(conn, **args, params=params)}
    off = {c.id: c for c in recall_candidates(conn, **args, params=replace(params, exchange_context=False))}
    assert on[str(reply_fact)].ranks.get("exchange_text") is not None
    assert on[str(reply_fact)].signals.bm25_exchange > 0
    assert str(reply_fact) not in off or "exchange_text" not in off[str(reply_fact)].ranks
    # The reply is recalled for the words only the question next to it has.
    hits = recall(conn, **args, params=replace(params, gate=False, limit=10), model=relevance_model(settings, EMBEDDER),
                  now=T0)
    assert str(reply_fact) in {h.id for h in hits}
    assert next(h for h in hits if h.id == str(reply_fact)).features["text_exchange"] > 0


def test_context_search_rejects_distillations(conn: psycopg.Connection) -> None:
    with pytest.raises(ValueError, match="conversation context"):
        bm25_search(conn, table="distillations", user_id="ann", query="x", limit=3,
                    embedding_model=EMBEDDER.model_name, context=True)


def test_concurrent_writers_of_one_user_take_turns_and_see_each_others_exchanges(db_url: str) -> None:
    import threading

    from yak_pipeline.store.database import connect

    with connect(db_url) as first, connect(db_url) as second:
        x = _insert(first, "The violin recital went well.", T0)  # not committed yet
        done = threading.Event()
        result: dict[str, str] = {}

        def write_second() -> None:
            result["y"] = _insert(second, "The cello part was hard.", T0 + timedelta(minutes=1))
            second.commit()
            done.set()

        worker = threading.Thread(target=write_second)
        worker.start()
        assert not done.wait(0.5), "the second writer of the same user must wait for the first"
        first.commit()
        worker.join(timeout=10)
        assert done.is_set()
        # The second writer ran after the first committed: both contexts hold both exchanges.
        assert {"violin", "cello"} <= _lexemes(first, x)
        assert {"violin", "cello"} <= _lexemes(first, result["y"])


# --- context vectors (sql/008) ----------------------------------------------------------------------


def _context_vectors(database: Database) -> dict[str, np.ndarray | None]:
    with database.connection() as c:
        rows = c.execute("SELECT id, context_embedding FROM memories WHERE deleted_at IS NULL").fetchall()
    return {str(i): (None if v is None else np.asarray(v.to_numpy() if hasattr(v, "to_numpy") else v)) for i, v in rows}


def test_context_text_is_the_conversation_in_order_with_neighbours_cut_nearest_the_exchange(
        conn: psycopg.Connection) -> None:
    long_answer = "Of course. " + "x" * 600 + " END-OF-PREVIOUS"
    first = _insert(conn, long_answer, T0)
    second = _insert(conn, "In the bathroom, Aiko is very tolerant.", T0 + timedelta(minutes=1))
    third = _insert(conn, "START-OF-NEXT " + "y" * 600, T0 + timedelta(minutes=2))
    text = conn.execute("SELECT yak_exchange_context_text(%s)", (second,)).fetchone()[0]
    before, own, after = text.split("\nUser: In the bathroom")[0], "In the bathroom", text.split("tolerant.")[1]
    # Each neighbour gives at most its 400 characters nearest the exchange; the exchange is whole.
    assert own in text and "END-OF-PREVIOUS" in before and "Of course" not in before and len(before) <= 400
    assert "START-OF-NEXT" in after and len(after) <= 400 + len("\nAssistant: Noted.\n")
    assert conn.execute("SELECT yak_exchange_context_text(%s)", (first,)).fetchone()[0].startswith("User: Of course")
    assert "END-OF-PREVIOUS" not in conn.execute("SELECT yak_exchange_context_text(%s)", (third,)).fetchone()[0][400:]


def test_context_vectors_are_filled_and_cleared_whenever_a_context_changes(database: Database) -> None:
    with database.connection() as c:
        ids = [_insert(c, text, T0 + timedelta(minutes=i)) for i, text in
               enumerate(["How do you develop your film?", "In the bathroom, mostly.", "Nice, any tips?"])]
    embed_pending_exchanges(database, EMBEDDER)
    vectors = _context_vectors(database)
    with database.connection() as c:
        texts = {i: c.execute("SELECT yak_exchange_context_text(%s)", (i,)).fetchone()[0] for i in ids}
    for memory_id in ids:  # each is the embedder's vector of its context text
        assert np.allclose(vectors[memory_id], EMBEDDER.embed_documents([texts[memory_id]])[0], atol=1e-6)
    assert embed_pending_contexts(database, EMBEDDER) == 0  # nothing left to do

    # A new exchange joins the conversation: its own context and its neighbour's change.
    with database.connection() as c:
        newest = _insert(c, "Use a red safelight.", T0 + timedelta(minutes=3))
    vectors = _context_vectors(database)
    assert vectors[newest] is None and vectors[ids[2]] is None
    assert vectors[ids[0]] is not None and vectors[ids[1]] is not None
    assert embed_pending_contexts(database, EMBEDDER) == 2

    # Forgetting one clears its neighbours' vectors at once: its words must stop counting.
    with database.connection() as c:
        forget_memories(c, user_id="ann", memory_ids=[ids[1]], actor="test", soft=True)
    vectors = _context_vectors(database)
    assert vectors[ids[0]] is None and vectors[ids[2]] is None and vectors[newest] is not None
    assert embed_pending_contexts(database, EMBEDDER) == 2
    with database.connection() as c:
        assert "bathroom" not in c.execute("SELECT yak_exchange_context_text(%s)", (ids[0],)).fetchone()[0]


def test_a_reply_is_found_by_the_meaning_of_the_question_it_answers(database: Database, settings: Settings) -> None:
    with database.connection() as c:
        seed_memory_with_distillation(
            c, user_id="ann", exchange="User: How do you develop your film photos?\nAssistant: Tell me.",
            distillation="User asked about photos.", occurred_at=T0)
        _, reply_fact = seed_memory_with_distillation(
            c, user_id="ann", exchange="User: In the bathroom, Aiko is very tolerant.\nAssistant: Ha.",
            distillation="User uses the bathroom; Aiko is tolerant.", occurred_at=T0 + timedelta(minutes=1))
        for i in range(6):
            seed_memory_with_distillation(c, user_id="ann", distillation=f"User keeps grocery list {i}.",
                                          exchange=f"User: Groceries list number {i}.\nAssistant: Ok.",
                                          occurred_at=T0 - timedelta(days=i + 1))
    embed_pending_exchanges(database, EMBEDDER)
    params = recall_params(settings, threshold=0.0, limit=10)
    query = "develop film photos"
    args = {"user_id": "ann", "query": query, "query_embedding": EMBEDDER.embed_query(query),
            "embedding_model": EMBEDDER.model_name}
    with database.connection() as c:
        on = {x.id: x for x in recall_candidates(c, **args, params=params)}
        off = {x.id: x for x in recall_candidates(c, **args, params=replace(params, exchange_context=False))}
        past = {x.id: x for x in recall_candidates(c, **args, params=params, as_of=T0 + timedelta(hours=1))}
    reply = on[str(reply_fact)]
    assert reply.ranks.get("context_vector") is not None
    # The reply alone shares no word with the query; read with the question, it does.
    assert reply.signals.cos_context > reply.signals.cos_exchange
    assert "context_vector" not in off.get(str(reply_fact), reply).ranks or str(reply_fact) not in off
    assert all(x.signals.cos_context is None for x in off.values())
    # As of a past moment a context may hold later words: the leg is off then.
    assert all(x.signals.cos_context is None and "context_vector" not in x.ranks for x in past.values())


def test_a_distillation_run_fills_the_context_vectors_of_its_own_users_only(database: Database) -> None:
    from yak_pipeline.llm import RulesProvider
    from yak_pipeline.services.distill import DistillJob, distill_memories

    with database.connection() as c:
        ann = [_insert(c, text, T0 + timedelta(minutes=i)) for i, text in enumerate(["I keep bees.", "Two hives."])]
        bob = [_insert(c, "I sail on Sundays.", T0, user="bob")]
    distill_memories(DistillJob(database, llm=RulesProvider(), embedder=EMBEDDER, prompt_version="v1"), ann)
    vectors = _context_vectors(database)
    assert all(vectors[m] is not None for m in ann)
    assert vectors[bob[0]] is None  # bob's own run (or `yak db index`) makes his


def test_a_distilled_exchange_gets_the_vector_of_its_current_context_with_its_own(database: Database) -> None:
    """Distilling an exchange embeds its context too when that is due (``context_to_embed``, in the
    same model call as the rest); a neighbour that arrives later clears it again, and the next
    run makes it anew."""
    from yak_pipeline.llm import RulesProvider
    from yak_pipeline.services.distill import DistillJob, distill_memories
    from yak_pipeline.store.memories import context_to_embed

    with database.connection() as c:
        ids = [_insert(c, text, T0 + timedelta(minutes=i)) for i, text in
               enumerate(["I keep bees.", "Two hives, in the garden.", "They swarmed in May."])]
        due = context_to_embed(c, ids[0], embedding_model=EMBEDDER.model_name)
        assert due == c.execute("SELECT yak_exchange_context_text(%s)", (ids[0],)).fetchone()[0]
    job = DistillJob(database, llm=RulesProvider(), embedder=EMBEDDER, prompt_version="v1")
    distill_memories(job, ids[:2])
    with database.connection() as c:
        texts = {i: c.execute("SELECT yak_exchange_context_text(%s)", (i,)).fetchone()[0] for i in ids}
        assert context_to_embed(c, ids[0], embedding_model=EMBEDDER.model_name) is None  # current now
        assert context_to_embed(c, ids[0], embedding_model="another-model") == texts[ids[0]]
    vectors = _context_vectors(database)
    for memory_id in ids:  # the third one's by the pass over the run's users after it
        assert np.allclose(vectors[memory_id], EMBEDDER.embed_documents([texts[memory_id]])[0], atol=1e-6)
    assert embed_pending_contexts(database, EMBEDDER, user_id="ann") == 0

    with database.connection() as c:
        later = _insert(c, "Honey next year.", T0 + timedelta(minutes=3))
    assert _context_vectors(database)[ids[2]] is None  # its context changed: its vector is cleared
    distill_memories(job, [later])
    vectors = _context_vectors(database)
    with database.connection() as c:
        for memory_id in (ids[2], later):
            text = c.execute("SELECT yak_exchange_context_text(%s)", (memory_id,)).fetchone()[0]
            assert "Honey" in text
            assert np.allclose(vectors[memory_id], EMBEDDER.embed_documents([text])[0], atol=1e-6)
