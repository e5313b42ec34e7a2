"""Import at database speed (issue 37, item 2): a batch of exchanges stored with one INSERT.

- The conversation context recall reads (sql/006) comes out of the one-statement path (sql/018's
  statement trigger, ``store.memories.insert_memories``) exactly as the per-row trigger of sql/006
  made it, inserting one exchange at a time: the same exchanges, for two users, one stored each
  way (the per-row trigger put back for the second), compared row by row; and a context vector
  is cleared where, and only where, the row path clears it.
- ``ingest_records`` keeps what storing one by one did: duplicates (in the batch and from
  before), rejected records with their one-line reason (a value the database refuses sends the
  batch back to one-by-one storing), the audit row, the profile line, the secret redacted.
- The BM25 postings written by a batch equal the postings recomputed from the rows.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import psycopg

from yak_pipeline.ingestion.formats.exchange_records import ExchangeRecord
from yak_pipeline.ingestion.records import ingest_records
from yak_pipeline.store.bm25 import bm25_search
from yak_pipeline.store.database import Database
from yak_pipeline.store.memories import insert_memories, insert_memory, new_exchange
from yak_pipeline.store.queue import queue_counts

T0 = datetime(2026, 3, 1, 14, 0, tzinfo=UTC)
DIM = 384


def _history() -> tuple[list[tuple[str, datetime]], list[tuple[str, datetime]]]:
    """What a user had before (three conversations) and an import's batch into it: new exchanges
    between old ones, at the very same time as old ones (arrival order decides), a conversation of
    their own, one alone (no neighbour within 30 minutes), the same text twice, and one already there."""
    before = [(f"Morning talk {i} about the garden.", T0 + timedelta(minutes=5 * i)) for i in range(4)]
    before += [(f"Evening talk {i} about the bakery.", T0 + timedelta(hours=6, minutes=i)) for i in range(3)]
    before += [("A lone note on chess.", T0 + timedelta(days=2))]
    batch = [
        ("Between the first two morning talks: tomatoes.", T0 + timedelta(minutes=2)),
        ("Same minute as morning talk 2: basil.", T0 + timedelta(minutes=10)),
        ("Same minute as morning talk 2, again: mint.", T0 + timedelta(minutes=10)),
        ("After the morning: compost, within the gap.", T0 + timedelta(minutes=40)),
        ("A new conversation on Kyoto, part 1.", T0 + timedelta(days=1)),
        ("A new conversation on Kyoto, part 2.", T0 + timedelta(days=1, minutes=3)),
        ("A new conversation on Kyoto, part 3.", T0 + timedelta(days=1, minutes=3)),
        ("Alone, weeks later: the dentist.", T0 + timedelta(days=30)),
        ("Evening talk 1 about the bakery.", T0 + timedelta(hours=6, minutes=1)),  # already there
        ("A new conversation on Kyoto, part 2.", T0 + timedelta(days=1, minutes=3)),  # twice in the batch
        ("Just before the evening: sourdough.", T0 + timedelta(hours=5, minutes=45)),
    ]
    return before, batch


def _exchange(text: str) -> str:
    return f"User: {text}\nAssistant: Noted."


def _store_history(conn: psycopg.Connection, user: str, *, one_by_one: bool) -> None:
    """``user``'s history, each earlier exchange with a context vector, then the batch: one INSERT,
    or one ``insert_memory`` after another."""
    before, batch = _history()
    for text, at in before:
        insert_memory(conn, new_exchange(user_id=user, content=_exchange(text), source="api", occurred_at=at))
    conn.execute("UPDATE memories SET context_embedding = %s, context_embedding_model = 'm' WHERE user_id = %s",
                 (np.ones(DIM, dtype=np.float32), user))
    if one_by_one:
        for text, at in batch:
            insert_memory(conn, new_exchange(user_id=user, content=_exchange(text), source="import", occurred_at=at))
    else:
        insert_memories(conn, [new_exchange(user_id=user, content=_exchange(text), source="import", occurred_at=at)
                               for text, at in batch])


def _contexts(conn: psycopg.Connection, user: str) -> list[tuple[str, str, bool]]:
    """Each live exchange of ``user`` in timeline order: its text, its context, whether its context vector stayed."""
    return [(r[0], r[1], r[2]) for r in conn.execute(
        """SELECT content, context_tsv::text, context_embedding IS NOT NULL FROM memories
            WHERE user_id = %s AND deleted_at IS NULL ORDER BY occurred_at, seq""", (user,)).fetchall()]


def test_a_batch_gets_the_contexts_the_per_row_trigger_gave(conn: psycopg.Connection) -> None:
    _store_history(conn, "bulk", one_by_one=False)
    # The path before sql/018: the row trigger of sql/006 on INSERT, one exchange per statement.
    conn.execute("DROP TRIGGER memories_context_insert ON memories")
    conn.execute("""CREATE TRIGGER memories_context_rows AFTER INSERT ON memories
                    FOR EACH ROW EXECUTE FUNCTION memories_context_trigger()""")
    _store_history(conn, "rows", one_by_one=True)

    bulk, rows = _contexts(conn, "bulk"), _contexts(conn, "rows")
    assert len(bulk) == 17 and bulk == rows
    # The neighbours' contexts changed, so their vectors were cleared; the far evening talks kept theirs.
    kept = {text for text, _, vector in bulk if vector}
    assert kept == {_exchange("Evening talk 1 about the bakery."), _exchange("Evening talk 2 about the bakery."),
                    _exchange("A lone note on chess.")}
    # And what the row trigger's own refresh computes now, over every row, changes nothing.
    conn.execute("SELECT yak_refresh_exchange_context(array_agg(id)) FROM memories")
    assert _contexts(conn, "bulk") == bulk


def test_a_batch_keeps_bm25_postings_equal_to_the_rows(conn: psycopg.Connection) -> None:
    _store_history(conn, "bulk", one_by_one=False)
    kept = conn.execute("SELECT leg, user_id, scope, lexeme, row_id, tf, dl FROM bm25_postings ORDER BY 1, 2, 3, 4, 5"
                        ).fetchall()
    conn.execute("SELECT yak_bm25_rebuild()")
    assert kept and kept == conn.execute(
        "SELECT leg, user_id, scope, lexeme, row_id, tf, dl FROM bm25_postings ORDER BY 1, 2, 3, 4, 5").fetchall()


def _record(text: str, minutes: int, user: str = "ann") -> ExchangeRecord:
    return ExchangeRecord(user_id=user, content=_exchange(text), occurred_at=T0 + timedelta(minutes=minutes),
                          line=minutes + 1)


def test_ingest_records_stores_a_batch_as_one_by_one_did(database: Database) -> None:
    records = [_record(f"Plan {i} for the allotment{', with rhubarb' if i == 4 else ''}.", i) for i in range(6)]
    records += [
        _record("Plan 2 for the allotment.", 2),  # the same exchange again in the batch
        _record("Please always answer in Spanish.", 7),  # a standing instruction: the profile's
        _record("My API key is sk-proj-abcdefghijklmnopqrstuvwxyz0123456789ABCD, keep it.", 8),
        _record("Written in the far future.", 60 * 24 * 365 * 30),  # refused: its date
        ExchangeRecord(user_id="ann", content="  ", occurred_at=T0, line=10),  # refused: nothing to store
    ]
    report = ingest_records(database, records, source="import", source_ref="notes.jsonl", now=T0 + timedelta(days=1))
    assert (len(report.stored), len(report.duplicates), len(report.grown)) == (8, 1, 0)
    assert report.duplicates[0] == report.stored[2]
    assert sorted(r.line for r in report.rejected) == [10, 60 * 24 * 365 * 30 + 1]
    assert all("\n" not in r.reason for r in report.rejected)
    assert report.partitions == {("ann", T0.date())}
    with database.connection() as conn:
        assert conn.execute("SELECT count(*) FROM audit_log WHERE action = 'ingest'").fetchone()[0] == 8
        assert conn.execute("SELECT count(*) FROM profile_lines WHERE user_id = 'ann'").fetchone()[0] == 1
        assert conn.execute("SELECT count(*) FROM audit_log WHERE action = 'redact_secrets'").fetchone()[0] == 1
        assert conn.execute("SELECT count(*) FROM memories WHERE content LIKE '%sk-proj-%'").fetchone()[0] == 0
        # What `yak queue status` shows while the vectors follow: all eight wait for theirs, and distilling.
        counts = queue_counts(conn, user_id="ann")
        assert (counts.unembedded_memories, counts.pending_memories) == (8, 8)
        # Searchable by its words at once, alone and in its conversation.
        for context in (False, True):
            hits = bm25_search(conn, table="memories", user_id="ann", query="rhubarb", limit=3, context=context)
            assert report.stored[4] in {str(h.id) for h in hits}

    again = ingest_records(database, records, source="import", source_ref="notes.jsonl", now=T0 + timedelta(days=1))
    assert (len(again.stored), len(again.duplicates), len(again.rejected)) == (0, 9, 2)


def test_a_value_the_database_refuses_sends_the_batch_back_to_one_by_one(database: Database) -> None:
    """A NUL character passes the record checks when a caller builds records itself (the parsers
    refuse it earlier): the batch's INSERT fails, and storing one by one keeps the others."""
    records = [_record("Before the bad one.", 0), _record("A NUL \x00 inside.", 1), _record("After it.", 2)]
    report = ingest_records(database, records, source="import", now=T0 + timedelta(days=1))
    assert len(report.stored) == 2
    assert [r.line for r in report.rejected] == [2] and "NUL" in report.rejected[0].reason
    with database.connection() as conn:
        assert conn.execute("SELECT count(*) FROM memories").fetchone()[0] == 2
