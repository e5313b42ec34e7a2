"""Raw memories and turns as the shells see them: store one, page through them, show, forget.

Each function is one transaction on a pooled connection; the API and the web page call these
rather than the store.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from yak_pipeline.embeddings import Embedder
from yak_pipeline.services.exchange_embeddings import embed_exchanges_now
from yak_pipeline.store import memories as memories_store
from yak_pipeline.store.database import Database
from yak_pipeline.store.distillations import list_distillations
from yak_pipeline.store.exchange_turns import StoredTurn, store_exchange_turn
from yak_pipeline.store.forget import ForgetReport, forget_memories


def user_has_memories(db: Database, user_id: str) -> bool:
    """Whether the user has any live memory (tells a mistyped user id from "nothing relevant")."""
    with db.connection() as conn:
        return memories_store.user_has_memories(conn, user_id)


class ExchangeForgotten(Exception):
    """The user's exchange with this text was forgotten softly: its row is kept but hidden from
    every read path, and (one row per user and text) the same text cannot be stored again."""


def store_memory(db: Database, *, user_id: str, content: str, source: str, occurred_at: datetime | None,
                 actor: str, embedder: Embedder | None = None) -> tuple[bool, dict[str, Any]]:
    """Store one exchange as a pending memory (once per user and text): ``(created, row)``.

    It is recallable as soon as this returns, by its words; with ``embedder`` also by its meaning
    (its vectors are made here, after the commit: ``services.exchange_embeddings.embed_exchanges_now``).
    :class:`ExchangeForgotten` when the user forgot this text with a soft delete."""
    exchange = memories_store.new_exchange(user_id=user_id, content=content, source=source, occurred_at=occurred_at,
                                           secrets=db.secrets)
    with db.connection() as conn:
        stored = memories_store.insert_memory(conn, exchange, actor=actor)
        row = memories_store.get_memory(conn, stored.id)
    if row is None:
        # Only a soft-forgotten duplicate is stored but not live (a new row is read back at once).
        raise ExchangeForgotten(f"user {user_id!r} forgot this exchange (soft delete keeps it, hidden): "
                                "the same text is not stored again")
    if stored.created and embedder is not None:
        embed_exchanges_now(db, embedder, [str(stored.id)])
    return stored.created, row


def list_memories(db: Database, **filters: Any) -> list[dict[str, Any]]:
    """Live memories, newest exchange first (filters as :func:`yak_pipeline.store.memories.list_memories`)."""
    with db.connection() as conn:
        return memories_store.list_memories(conn, **filters)


def get_memory(db: Database, memory_id: UUID | str, *, user_id: str | None = None) -> dict[str, Any] | None:
    """One live memory (for ``user_id``), or None."""
    with db.connection() as conn:
        return memories_store.get_memory(conn, memory_id, user_id=user_id)


def memory_with_distillations(db: Database, memory_id: UUID | str, *, user_id: str | None,
                              limit: int = 100) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """A live memory (for ``user_id``) and its distillations; None when not found."""
    with db.connection() as conn:
        row = memories_store.get_memory(conn, memory_id, user_id=user_id)
        if row is None:
            return None
        return row, list_distillations(conn, memory_id=memory_id, user_id=row["user_id"], limit=limit)


def forget_memory(db: Database, memory_id: UUID | str, *, user_id: str | None, actor: str,
                  soft: bool = False) -> ForgetReport | None:
    """Forget one memory and everything made from it (DESIGN §4); None when not found (for ``user_id``)."""
    with db.connection() as conn:
        row = memories_store.get_memory(conn, memory_id, user_id=user_id)
        if row is None:
            return None
        return forget_memories(conn, user_id=row["user_id"], memory_ids=[memory_id], actor=actor, soft=soft)


def record_turn(db: Database, *, user_id: str, user_message: str, assistant_message: str,
                recalled_ids: Sequence[UUID | str], occurred_at: datetime | None,
                actor: str, embedder: Embedder | None = None) -> StoredTurn:
    """Store a finished turn's exchange and queue the turn (the path of ``POST /api/turns``, the
    memory proxy and MCP).

    With ``embedder`` the new exchange gets its vectors at once (as :func:`store_memory`)."""
    with db.connection() as conn:
        stored = store_exchange_turn(conn, user_id=user_id, user_message=user_message,
                                     assistant_message=assistant_message, recalled_ids=recalled_ids,
                                     occurred_at=occurred_at, actor=actor, secrets=db.secrets)
    if stored.created and embedder is not None:
        embed_exchanges_now(db, embedder, [str(stored.memory_id)])
    return stored


def rebuild_exchange_context(db: Database, *, user_id: str | None = None) -> int:
    """Recompute every live exchange's conversation context (a repair; see ``yak db index``); rows done."""
    with db.connection() as conn:
        return memories_store.rebuild_exchange_context(conn, user_id=user_id)
