"""``/api/queue``: what waits for the pipeline, what failed, and what the drop folder refused."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Final

from fastapi import APIRouter, Query

from yak_pipeline.api.dependencies import Caller, Services
from yak_pipeline.api.schemas.base import UserId, rows_to
from yak_pipeline.api.schemas.operations import FailedItem, QuarantinedItem, QuarantineOut, QueueOut
from yak_pipeline.ingestion.drop_folder import failed_dir, list_quarantine
from yak_pipeline.services.queue_watch import queue_status

router = APIRouter(prefix="/api/queue", tags=["operations"])

# The answer stays small however much piles up in failed/: the counts cover everything.
MAX_QUARANTINE_ITEMS: Final = 20
MAX_REASONS: Final = 5


@router.get("", response_model=QueueOut)
def queue(
    caller: Caller,
    services: Services,
    user_id: Annotated[UserId | None, Query(description="Only this user's (a user key: its own).")] = None,
) -> QueueOut:
    """Pending memories (awaiting distillation), pending turns (awaiting warmth evaluation), the
    latest failed items with their errors, and (admin keys) the drop folder's quarantine: files
    it could not read and records it rejected, with the reasons."""
    scope = caller.user_filter(user_id)
    counts, failed = queue_status(services.database, services.alerter, user_id=scope)
    return QueueOut(pending_memories=counts.pending_memories, pending_turns=counts.pending_turns,
                    failed_memories=counts.failed_memories, failed_turns=counts.failed_turns,
                    unembedded_memories=counts.unembedded_memories,
                    failed=rows_to(FailedItem, failed),
                    quarantine=_quarantine(services.settings.resolved_drop_dir) if caller.is_admin else None)


def _quarantine(drop_dir: Path) -> QuarantineOut:
    """The drop folder's ``failed/``, read from disk (the API runs beside the pipeline, on one ``YAK_HOME``)."""
    entries = list_quarantine(drop_dir)
    return QuarantineOut(
        folder=str(failed_dir(drop_dir)),
        files=sum(1 for e in entries if e.kind == "file"),
        records=sum(e.records for e in entries),
        items=[QuarantinedItem(name=e.name, kind=e.kind, records=e.records, reasons=list(e.reasons[:MAX_REASONS]),
                               quarantined_at=e.quarantined_at) for e in entries[:MAX_QUARANTINE_ITEMS]],
    )
