"""BM25 from trigger-kept postings (sql/013, store.bm25._bm25_from_postings).

The top k from the postings must equal the computation from the rows (``exact=True``) on every
query, the postings must equal a recomputation from the rows after every kind of write, and the
query must read index entries only, no exchange or distillation row.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import psycopg
import pytest

from yak_pipeline.store.bm25 import _BM25_POSTINGS_SQL, BM25_B, BM25_K1, bm25_search, fold_bm25_statistics
from yak_pipeline.store.database import connect
from yak_pipeline_tests.store_helpers import EMBEDDER, seed_memory_with_distillation

MODEL = EMBEDDER.model_name
NOW = datetime(2026, 6, 1, tzinfo=UTC)
# A few words in most rows, many in a few: the shape of real text (a common word's rows are many).
COMMON = ["like", "work", "today", "really", "home", "friend"]
RARE = ["kayak", "sourdough", "violin", "lisbon", "peanut", "kitten", "marathon", "chess", "tomato", "tokyo",
        "bakery", "nurse", "guitar", "canal", "garden", "museum", "sister", "wedding", "vespa", "sari"]
POSTINGS = ("SELECT leg, user_id, scope, lexeme, row_id, tf, dl FROM bm25_postings ORDER BY 1, 2, 3, 4, 5",
            # The statistics as a reader sums them (sql/014): folded or not, the same.
            "SELECT leg, user_id, scope, lexeme, sum(df), sum(dl_sum), sum(dl_rows) FROM bm25_statistics "
            "GROUP BY 1, 2, 3, 4 HAVING sum(df) <> 0 OR sum(dl_sum) <> 0 OR sum(dl_rows) <> 0 ORDER BY 1, 2, 3, 4")


def _sentence(rng: np.random.Generator) -> str:
    words = list(rng.choice(COMMON, size=int(rng.integers(2, 5)))) + list(rng.choice(RARE, size=int(rng.integers(0, 3))))
    rng.shuffle(words)
    return "I " + " and ".join(words) + "."


def _seed(conn: psycopg.Connection, user_id: str, n: int, seed: int) -> list[tuple[str, str]]:
    rng = np.random.default_rng(seed)
    ids = []
    for i in range(n):
        said = _sentence(rng)
        memory_id, distillation_id = seed_memory_with_distillation(
            conn, user_id=user_id, exchange=f"User: {said}\nAssistant: {_sentence(rng)}",
            distillation=f"User said: {said}", embedding=np.zeros(EMBEDDER.dimensions, dtype=np.float32) + 0.1,
            occurred_at=NOW - timedelta(minutes=7 * i))
        ids.append((str(memory_id), str(distillation_id)))
    return ids


def _postings(conn: psycopg.Connection) -> tuple[list]:
    return tuple(conn.execute(sql).fetchall() for sql in POSTINGS)  # type: ignore[return-value]


def _assert_postings_equal_a_recount(conn: psycopg.Connection) -> None:
    kept = _postings(conn)
    conn.execute("SAVEPOINT recount")
    conn.execute("SELECT yak_bm25_rebuild()")
    recounted = _postings(conn)
    conn.execute("ROLLBACK TO SAVEPOINT recount")
    assert kept == recounted
    assert all(kept)
    # Folding the deltas leaves one row per key and the same sums.
    conn.execute("SAVEPOINT fold")
    fold_bm25_statistics(conn)
    assert _postings(conn) == kept
    assert conn.execute("SELECT count(*) FROM bm25_statistics").fetchone()[0] == len(kept[1])
    conn.execute("ROLLBACK TO SAVEPOINT fold")


def _legs(user_id: str) -> list[dict]:
    return [dict(table="distillations", user_id=user_id, embedding_model=MODEL),
            dict(table="memories", user_id=user_id, context=True)]


def _assert_postings_equal_rows(conn: psycopg.Connection, user_id: str, queries: list[str], limit: int) -> None:
    for query in queries:
        for leg in _legs(user_id):
            pruned = bm25_search(conn, query=query, limit=limit, **leg)  # from the postings
            exact = bm25_search(conn, query=query, limit=limit, exact=True, **leg)
            assert len(pruned) == len(exact), (query, leg)
            assert [h.score for h in pruned] == pytest.approx([h.score for h in exact], rel=1e-9), (query, leg)
            # Rows of equal score may come in either order only at the cut; elsewhere the ids match.
            assert [h.id for h in pruned] == [h.id for h in exact] or \
                [round(h.score, 9) for h in pruned] == [round(h.score, 9) for h in exact], (query, leg)


def test_bm25_from_postings_equals_the_computation_from_the_rows(conn: psycopg.Connection) -> None:
    _seed(conn, "alice", 300, seed=1)
    _seed(conn, "bob", 40, seed=2)
    rng = np.random.default_rng(3)
    queries = ["what do I like at work today?", "kayak", "do I really like my sister's wedding?",
               "tell me about home and friends"]
    queries += [" ".join(rng.choice(COMMON + RARE, size=int(rng.integers(1, 6)))) for _ in range(25)]
    for limit in (1, 10, 50, 500):
        _assert_postings_equal_rows(conn, "alice", queries, limit)
    _assert_postings_equal_rows(conn, "bob", queries[:10], 10)
    assert bm25_search(conn, table="memories", user_id="carol", query="kayak", limit=10, context=True) == []
    assert bm25_search(conn, table="memories", user_id="alice", query="zeppelin", limit=10, context=True) == []


def test_the_default_legs_read_index_entries_only(conn: psycopg.Connection) -> None:
    _seed(conn, "alice", 200, seed=4)
    conn.commit()
    conn.autocommit = True
    conn.execute("VACUUM ANALYZE memories")  # the visibility map index-only scans need, as autovacuum sets it
    conn.execute("VACUUM ANALYZE bm25_postings")
    conn.execute("SELECT yak_bm25_fold_statistics()")
    conn.execute("VACUUM ANALYZE bm25_statistics")
    plan = "\n".join(r[0] for r in conn.execute(
        "EXPLAIN (COSTS OFF) " + _BM25_POSTINGS_SQL,
        {"leg": "contexts", "user": "alice", "scope": "", "text": "what do I like at work?", "limit": 50,
         "k1": BM25_K1, "b": BM25_B}))
    # Every scan of a table (not of a CTE or a function) reads an index alone, and none reads a row.
    scans = [line.strip().removeprefix("->  ") for line in plan.splitlines()
             if "Scan" in line and " on " in line and " on unnest" not in line and "CTE" not in line]
    assert any("bm25_postings_pkey" in scan for scan in scans), plan
    assert any("bm25_statistics_key_idx" in scan for scan in scans), plan
    assert not any(f" on {table} " in scan for table in ("memories", "distillations") for scan in scans), plan
    assert all(scan.startswith("Index Only Scan") for scan in scans), plan


def test_postings_follow_every_kind_of_write(conn: psycopg.Connection) -> None:
    alice = _seed(conn, "alice", 30, seed=5)
    _seed(conn, "bob", 10, seed=6)
    _assert_postings_equal_a_recount(conn)
    queries = ["kayak at work", "sourdough and violin", "friend home today"]
    memory, distillation = alice[0]
    for change in (
        "UPDATE distillations SET status = 'review' WHERE id = %(d)s",              # the gate holds one back
        "UPDATE distillations SET status = 'active' WHERE id = %(d)s",              # a person approves it
        "UPDATE distillations SET content = 'User paddles a kayak to work.' WHERE id = %(d)s",  # a new version
        "UPDATE distillations SET warmth = 0.9 WHERE user_id = 'alice'",           # no change to the words
        "UPDATE distillations SET embedding_model = 'another-model' WHERE id = %(d)s",  # re-embedded
        "UPDATE memories SET content = 'User: I kayak to work.\nAssistant: Brave.' WHERE id = %(m)s",
        "UPDATE memories SET deleted_at = now() WHERE id = %(m)s",                  # soft-forgotten
        "DELETE FROM memories WHERE id = %(m2)s",                                   # forgotten, cascades
        "UPDATE distillations SET status = 'merged' WHERE id = %(d3)s",
    ):
        conn.execute(change, {"d": distillation, "m": memory, "m2": alice[1][0], "d3": alice[2][1]})
        _assert_postings_equal_a_recount(conn)
        _assert_postings_equal_rows(conn, "alice", queries, 10)
    conn.execute("TRUNCATE memories CASCADE")
    assert _postings(conn) == ([], [])
    _seed(conn, "alice", 5, seed=7)
    _assert_postings_equal_a_recount(conn)


def test_folding_while_a_writer_is_open_loses_none_of_its_counts(db_url: str) -> None:
    """A fold sums the deltas it sees; a writer's deltas it cannot see yet (uncommitted) stay,
    and count once the writer commits: the sums equal a recount from the rows."""
    with connect(db_url) as writer, connect(db_url) as folder:
        _seed(writer, "alice", 20, seed=8)
        writer.commit()
        _seed(writer, "alice", 10, seed=9)  # open: the folder cannot see these deltas
        writer.execute("UPDATE memories SET deleted_at = now() WHERE id IN "
                       "(SELECT id FROM memories WHERE user_id = 'alice' ORDER BY occurred_at LIMIT 3)")
        assert fold_bm25_statistics(folder) > 0
        folder.commit()
        writer.commit()
        _assert_postings_equal_a_recount(writer)
        _assert_postings_equal_rows(writer, "alice", ["kayak at work", "friend home today", "sister"], 10)
