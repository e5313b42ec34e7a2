"""Shared helpers for store tests: seed memories and distillations without the pipeline."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from uuid import UUID

import psycopg

from yak_pipeline.embeddings.hashing import HashingEmbedder
from yak_pipeline.llm.prompts import OUTPUT_SCHEMA_VERSION
from yak_pipeline.store.database import Database
from yak_pipeline.store.distillations import NewDistillation, insert_distillation
from yak_pipeline.store.memories import insert_memory, new_exchange

EMBEDDER = HashingEmbedder(384)


def seed_memory_with_distillation(
    conn: psycopg.Connection,
    *,
    user_id: str,
    exchange: str,
    distillation: str,
    confidence: float = 0.9,
    tier: str = "medium",
    embedding: Sequence[float] | None = None,
    occurred_at: datetime | None = None,
) -> tuple[UUID, UUID]:
    """Insert one memory and one distillation of it; return (memory id, distillation id)."""
    when = occurred_at or datetime.now(UTC)
    memory = insert_memory(conn, new_exchange(user_id=user_id, content=exchange, source="import", occurred_at=when))
    distillation_id = insert_distillation(
        conn,
        NewDistillation(
            memory_id=memory.id,
            user_id=user_id,
            content=distillation,
            confidence=confidence,
            tier=tier,
            embedding=embedding if embedding is not None else EMBEDDER.embed_query(distillation),
            embedding_model=EMBEDDER.model_name,
            prompt_version="test",
            refreshed_at=when,
            schema_version=OUTPUT_SCHEMA_VERSION,
        ),
    )
    conn.execute("UPDATE memories SET status = 'distilled' WHERE id = %s", (memory.id,))
    return memory.id, distillation_id


@contextmanager
def recorded_statements(conn: psycopg.Connection) -> Iterator[list[tuple[str, object]]]:
    """Every statement ``conn`` sends inside the block, in order, as (its text, its parameters).

    Recorded through the connection's cursor factory (``auto_explain`` would need a superuser, and
    the suite also runs against an external server as its database's owner); the plain cursor is
    put back when the block ends, whatever happens.
    """
    sent: list[tuple[str, object]] = []

    class Recording(psycopg.Cursor):
        def execute(self, query, params=None, **kwargs):  # noqa: ANN001, ANN202 - psycopg's signature
            sent.append((query if isinstance(query, str) else query.as_string(conn), params))
            return super().execute(query, params, **kwargs)

    conn.cursor_factory = Recording
    try:
        yield sent
    finally:
        conn.cursor_factory = psycopg.Cursor


@contextmanager
def idle_connections(db: Database, wanted: int) -> Iterator[list[psycopg.Connection]]:
    """Up to ``wanted`` pooled connections free now (``Database.idle_connection`` each), held until
    the block ends: recall's legs on held connections instead of lenders."""
    with ExitStack() as stack:
        spare: list[psycopg.Connection] = []
        for _ in range(max(wanted, 0)):
            conn = stack.enter_context(db.idle_connection())
            if conn is None:
                break
            spare.append(conn)
        yield spare
