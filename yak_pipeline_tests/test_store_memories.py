"""The raw layer and the small stores: idempotent ingest, user scoping, SKIP LOCKED claims."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from yak_pipeline.core.types import InvalidUserId
from yak_pipeline.store.conflicts import close_conflict, conflicting_ids, list_conflicts, record_conflict
from yak_pipeline.store.database import Database, connect
from yak_pipeline.store.distillations import add_version, get_distillation, list_versions
from yak_pipeline.store.memories import claim_pending_memories, get_memory, insert_memory, list_memories, new_exchange
from yak_pipeline.store.turns import insert_turn
from yak_pipeline.store.warmth import apply_relevance, reset_warmth, warmth_history
from yak_pipeline_tests.store_helpers import EMBEDDER, seed_memory_with_distillation

EXCHANGE = "User: I moved to Lisbon last spring.\nAssistant: How are you finding it?"


def test_same_exchange_twice_is_stored_once(conn: psycopg.Connection) -> None:
    first = insert_memory(conn, new_exchange(user_id="alice", content=EXCHANGE, source="api"))
    # Line-ending differences are the same exchange.
    second = insert_memory(conn, new_exchange(user_id="alice", content=EXCHANGE.replace("\n", "\r\n") + "\n", source="api"))
    other_user = insert_memory(conn, new_exchange(user_id="bob", content=EXCHANGE, source="api"))
    assert first.created and not second.created and other_user.created
    assert second.id == first.id and other_user.id != first.id
    assert conn.execute("SELECT count(*) FROM memories").fetchone()[0] == 2
    stored = get_memory(conn, first.id)
    assert stored["content"] == EXCHANGE and stored["status"] == "pending"
    assert conn.execute("SELECT count(*) FROM audit_log WHERE action = 'ingest'").fetchone()[0] == 2


def test_reads_are_scoped_by_user(conn: psycopg.Connection) -> None:
    memory = insert_memory(conn, new_exchange(user_id="alice", content=EXCHANGE, source="api"))
    assert get_memory(conn, memory.id, user_id="bob") is None
    assert get_memory(conn, memory.id, user_id="alice") is not None
    assert list_memories(conn, user_id="bob") == []
    assert [m["id"] for m in list_memories(conn, user_id="alice")] == [memory.id]


@pytest.mark.parametrize("bad", ["", "a|b", "-leading", "x" * 65, "spaces here"])
def test_invalid_user_ids_are_refused(conn: psycopg.Connection, bad: str) -> None:
    with pytest.raises(InvalidUserId):
        insert_memory(conn, new_exchange(user_id=bad, content=EXCHANGE, source="api"))


def test_naive_timestamps_and_empty_content_are_refused(conn: psycopg.Connection) -> None:
    with pytest.raises(ValueError):
        insert_memory(conn, new_exchange(user_id="alice", content="   \n ", source="api"))
    with pytest.raises(ValueError):
        insert_memory(conn, new_exchange(user_id="alice", content=EXCHANGE, source="api", occurred_at=datetime(2024, 1, 1)))
    assert conn.execute("SELECT count(*) FROM memories").fetchone()[0] == 0


def test_concurrent_claims_never_share_a_memory(db_url: str) -> None:
    with connect(db_url) as setup:
        for i in range(10):
            insert_memory(setup, new_exchange(user_id="alice", content=f"User: fact {i}\nAssistant: ok", source="api"))
        setup.commit()
    with connect(db_url) as worker_a, connect(db_url) as worker_b:
        claimed_a = claim_pending_memories(worker_a, limit=6)
        claimed_b = claim_pending_memories(worker_b, limit=6)
        ids_a = {m["id"] for m in claimed_a}
        ids_b = {m["id"] for m in claimed_b}
    assert len(ids_a) == 6 and len(ids_b) == 4
    assert ids_a.isdisjoint(ids_b)


def test_versions_keep_every_text(conn: psycopg.Connection) -> None:
    _, older = seed_memory_with_distillation(conn, user_id="alice", exchange=EXCHANGE, distillation="User lives in Lisbon.")
    _, newer = seed_memory_with_distillation(conn, user_id="alice", exchange="User: Lisbon is home now\nAssistant: nice",
                                             distillation="User's home is Lisbon.")
    merged_text = "User lives in Lisbon, which is home now."
    version = add_version(conn, older, content=merged_text, embedding=EMBEDDER.embed_query(merged_text),
                          embedding_model=EMBEDDER.model_name, reason="merged", merged_from=[newer])
    assert version == 2
    versions = list_versions(conn, older)
    assert [v["content"] for v in versions] == ["User lives in Lisbon.", merged_text]
    assert versions[1]["merged_from"] == [newer]
    assert get_distillation(conn, older)["content"] == merged_text


def test_warmth_changes_are_clamped_and_recorded(conn: psycopg.Connection) -> None:
    _, distillation_id = seed_memory_with_distillation(conn, user_id="alice", exchange=EXCHANGE,
                                                       distillation="User lives in Lisbon.")
    turn = insert_turn(conn, user_id="alice", user_message="where do I live?", assistant_message="Lisbon",
                       recalled_ids=[distillation_id])
    updates = [apply_relevance(conn, distillation_id, relevance_score=0.95, reason="turn", turn_id=turn)
               for _ in range(7)]
    assert [round(u.change.after, 6) for u in updates] == [0.6, 0.7, 0.8, 0.9, 1.0, 1.0, 1.0]
    down = apply_relevance(conn, distillation_id, relevance_score=0.1, reason="turn", turn_id=turn)
    assert down.change.after == pytest.approx(0.8)
    assert apply_relevance(conn, distillation_id, relevance_score=0.9, reason="turn", user_id="bob") is None
    assert len(warmth_history(conn, distillation_id)) == 8
    assert reset_warmth(conn, [distillation_id], actor="test") == 1
    assert get_distillation(conn, distillation_id)["warmth"] == 0.5


def test_turns_drop_recalled_ids_of_other_users(conn: psycopg.Connection) -> None:
    _, mine = seed_memory_with_distillation(conn, user_id="alice", exchange=EXCHANGE, distillation="User lives in Lisbon.")
    _, theirs = seed_memory_with_distillation(conn, user_id="bob", exchange=EXCHANGE, distillation="User lives in Lisbon.")
    turn = insert_turn(conn, user_id="alice", user_message="q", assistant_message="a", recalled_ids=[mine, theirs])
    recalled = conn.execute("SELECT recalled_ids FROM turns WHERE id = %s", (turn,)).fetchone()[0]
    assert recalled == [mine]


def test_conflicts_are_one_per_pair_and_flag_both(conn: psycopg.Connection) -> None:
    _, a = seed_memory_with_distillation(conn, user_id="alice", exchange=EXCHANGE, distillation="User lives in Lisbon.")
    _, b = seed_memory_with_distillation(conn, user_id="alice", exchange="User: I live in Porto\nAssistant: ok",
                                         distillation="User lives in Porto.")
    conflict = record_conflict(conn, user_id="alice", a=b, b=a, score=0.9)
    assert conflict is not None
    assert record_conflict(conn, user_id="alice", a=a, b=b, score=0.95) is None
    assert conflicting_ids(conn, a) == {str(b)}
    assert get_distillation(conn, a)["needs_review"] and get_distillation(conn, b)["needs_review"]
    assert list_conflicts(conn, user_id="bob") == []
    assert not close_conflict(conn, conflict, status="resolved", user_id="bob")
    assert close_conflict(conn, conflict, status="resolved", resolution="moved to Porto", user_id="alice")
    assert list_conflicts(conn, user_id="alice") == []


@pytest.mark.parametrize("latest_first", [True, False])
def test_of_two_later_statements_the_latest_supersedes_whatever_order_they_are_recorded_in(
        conn: psycopg.Connection, latest_first: bool) -> None:
    """Conflict checks run side by side record a memory's conflicts in any order: it ends
    superseded by the latest statement it contradicts all the same."""
    start = datetime(2026, 3, 1, tzinfo=UTC)
    said = {}
    for days, city in ((0, "Lisbon"), (10, "Porto"), (20, "Madrid")):
        said[city] = seed_memory_with_distillation(
            conn, user_id="alice", exchange=f"User: I live in {city}\nAssistant: ok",
            distillation=f"User lives in {city}.", occurred_at=start + timedelta(days=days))[1]
    order = ["Madrid", "Porto"] if latest_first else ["Porto", "Madrid"]
    for city in order:
        assert record_conflict(conn, user_id="alice", a=said["Lisbon"], b=said[city], score=0.9) is not None
    assert str(get_distillation(conn, said["Lisbon"])["superseded_by"]) == str(said["Madrid"])


def test_a_conflict_cannot_span_users(conn: psycopg.Connection) -> None:
    _, a = seed_memory_with_distillation(conn, user_id="alice", exchange=EXCHANGE, distillation="User lives in Lisbon.")
    _, b = seed_memory_with_distillation(conn, user_id="bob", exchange=EXCHANGE, distillation="User lives in Lisbon.")
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        record_conflict(conn, user_id="alice", a=a, b=b, score=0.9)


def test_pool_connection_commits_and_rolls_back(database: Database) -> None:
    with database.connection() as conn:
        insert_memory(conn, new_exchange(user_id="alice", content=EXCHANGE, source="api"))
    with pytest.raises(RuntimeError):
        with database.connection() as conn:
            insert_memory(conn, new_exchange(user_id="alice", content="User: other\nAssistant: x", source="api"))
            raise RuntimeError("abort mid-way")
    with database.connection() as conn:
        assert conn.execute("SELECT count(*) FROM memories").fetchone()[0] == 1
