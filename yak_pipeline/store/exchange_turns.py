"""A turn posted by a client: the exchange stored as a memory and the turn queued for evaluation.

Both land in the caller's transaction, so a turn never exists without its memory. Posting the
same exchange again (a client retrying after a timeout) returns the turn already queued for it
instead of queueing a second one, which would count its warmth twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import psycopg

from yak_pipeline.core.exchanges import format_exchange
from yak_pipeline.core.secrets import SecretsPolicy
from yak_pipeline.store.memories import insert_memory, new_exchange
from yak_pipeline.store.turns import insert_turn


@dataclass(frozen=True)
class StoredTurn:
    """The turn's id, the memory it was stored as, and whether this call queued it."""

    turn_id: UUID
    memory_id: UUID
    created: bool


def store_exchange_turn(
    conn: psycopg.Connection,
    *,
    user_id: str,
    user_message: str,
    assistant_message: str,
    recalled_ids: Sequence[UUID | str],
    occurred_at: datetime | None = None,
    source: str = "api",
    actor: str = "system",
    secrets: SecretsPolicy = "redact",
) -> StoredTurn:
    """Store the exchange (idempotent on its text) and queue its turn once; secrets as ``new_exchange``."""
    exchange = new_exchange(user_id=user_id, content=format_exchange(user_message, assistant_message), source=source,
                            occurred_at=occurred_at, secrets=secrets)
    memory = insert_memory(conn, exchange, actor=actor)
    if not memory.created:
        existing = conn.execute(
            "SELECT id FROM turns WHERE memory_id = %(id)s AND deleted_at IS NULL ORDER BY created_at LIMIT 1",
            {"id": memory.id},
        ).fetchone()
        if existing is not None:
            return StoredTurn(existing[0], memory.id, False)
    turn_id = insert_turn(conn, user_id=user_id, user_message=user_message, assistant_message=assistant_message,
                          recalled_ids=recalled_ids, memory_id=memory.id, occurred_at=occurred_at)
    return StoredTurn(turn_id, memory.id, True)
