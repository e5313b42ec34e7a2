"""What the web page shows of a user's memory (and, for admins, of every user), read in one
transaction per page: counts, recent changes, one distillation with everything around it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from uuid import UUID

from yak_pipeline.alerts import Alerter
from yak_pipeline.services.queue_watch import watched_queue_counts
from yak_pipeline.store import overview as overview_store
from yak_pipeline.store.conflicts import open_conflicts_of
from yak_pipeline.store.database import Database
from yak_pipeline.store.distillations import get_distillation, list_versions, supersession_of
from yak_pipeline.store.memories import get_memory, list_memories
from yak_pipeline.store.queue import QueueCounts
from yak_pipeline.store.warmth import warmth_history


def users_overview(db: Database, alerter: Alerter) -> tuple[list[dict[str, Any]], QueueCounts]:
    """The users with memories and the whole pipeline's (watched) queue."""
    with db.connection() as conn:
        return overview_store.list_users(conn), watched_queue_counts(conn, alerter, user_id=None)


def user_overview(db: Database, alerter: Alerter, user_id: str) -> tuple[dict[str, int], QueueCounts]:
    """A user's counts and queue (the whole queue is still watched for overflow)."""
    with db.connection() as conn:
        return overview_store.user_counts(conn, user_id), watched_queue_counts(conn, alerter, user_id=user_id)


def exchanges_of(db: Database, memory_ids: Iterable[str], *, user_id: str) -> dict[str, dict[str, Any] | None]:
    """The raw exchange behind each memory id (the search page's "show the exchange")."""
    with db.connection() as conn:
        return {memory_id: get_memory(conn, memory_id, user_id=user_id) for memory_id in memory_ids}


def distillation_page(db: Database, distillation_id: UUID | str, *, user_id: str) -> dict[str, Any] | None:
    """One distillation with its versions, raw exchange, latest warmth events, open conflicts and
    supersession (the newer memory that replaced it, the older ones it replaced); None when not found."""
    with db.connection() as conn:
        row = get_distillation(conn, distillation_id, user_id=user_id)
        if row is None:
            return None
        return {"d": row, "versions": list_versions(conn, distillation_id),
                "exchange": get_memory(conn, row["memory_id"], user_id=user_id),
                "warmth": warmth_history(conn, distillation_id, limit=20),
                "conflicts": open_conflicts_of(conn, distillation_id),
                **supersession_of(conn, distillation_id)}


def recent_changes(db: Database, user_id: str, *, limit: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The latest changed distillations and the latest exchanges of a user."""
    with db.connection() as conn:
        return overview_store.recent_distillations(conn, user_id, limit=limit), list_memories(conn, user_id=user_id,
                                                                                              limit=limit)
