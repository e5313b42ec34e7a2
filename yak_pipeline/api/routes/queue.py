"""``/api/queue``: what waits for the pipeline, and what failed."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from yak_pipeline.api.dependencies import Caller, Services
from yak_pipeline.api.queue_watch import watched_queue_counts
from yak_pipeline.api.schemas import FailedItem, QueueOut, UserId, rows_to
from yak_pipeline.store.queue import failed_items

router = APIRouter(prefix="/api/queue", tags=["operations"])


@router.get("", response_model=QueueOut)
def queue(
    caller: Caller,
    services: Services,
    user_id: Annotated[UserId | None, Query(description="Only this user's (a user key: its own).")] = None,
) -> QueueOut:
    """Pending memories (awaiting distillation), pending turns (awaiting warmth evaluation), and
    the latest failed items with their errors."""
    scope = caller.user_filter(user_id)
    with services.database.connection() as conn:
        counts = watched_queue_counts(conn, services.alerter, user_id=scope)
        failed = failed_items(conn, user_id=scope)
    return QueueOut(pending_memories=counts.pending_memories, pending_turns=counts.pending_turns,
                    failed_memories=counts.failed_memories, failed_turns=counts.failed_turns,
                    failed=rows_to(FailedItem, failed))
