"""``/api/conflicts``: contradictions between a user's distillations, and settling them."""

from __future__ import annotations

from typing import Annotated, Literal
from uuid import UUID

from fastapi import APIRouter, HTTPException, Query, status

from yak_pipeline.api.dependencies import Caller, Services
from yak_pipeline.api.schemas.base import UserId, rows_to
from yak_pipeline.api.schemas.curation import ConflictClose, ConflictClosed, ConflictKeep, ConflictOut
from yak_pipeline.services.curation import close_conflict, list_conflicts

router = APIRouter(prefix="/api/conflicts", tags=["conflicts"])


@router.get("", response_model=list[ConflictOut])
def conflicts(
    caller: Caller,
    services: Services,
    user_id: Annotated[UserId | None, Query(description="Only this user's (a user key: its own).")] = None,
    conflict_status: Annotated[Literal["open", "resolved", "dismissed", "all"], Query(alias="status")] = "open",
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> list[ConflictOut]:
    """Conflicts with both sides' text, newest first (open ones unless asked otherwise)."""
    rows = list_conflicts(services.database, user_id=caller.user_filter(user_id),
                          status=None if conflict_status == "all" else conflict_status, limit=limit)
    return rows_to(ConflictOut, rows)


def _close(conflict_id: UUID, new_status: Literal["resolved", "dismissed"], caller: Caller, services: Services, *,
           resolution: str | None, keep: Literal["a", "b", "both"] | None = None) -> ConflictClosed:
    closed = close_conflict(services.database, conflict_id, status=new_status, keep=keep, resolution=resolution,
                            user_id=caller.scope, actor=caller.actor)
    if not closed:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no open conflict {conflict_id}")
    return ConflictClosed(id=conflict_id, status=new_status)


@router.post("/{conflict_id}/resolve", response_model=ConflictClosed)
def resolve(conflict_id: UUID, caller: Caller, services: Services, body: ConflictClose | None = None) -> ConflictClosed:
    """Mark an open conflict resolved (e.g. after rejecting or editing one side), with an optional note."""
    return _close(conflict_id, "resolved", caller, services, resolution=body.resolution if body else None)


@router.post("/{conflict_id}/dismiss", response_model=ConflictClosed)
def dismiss(conflict_id: UUID, caller: Caller, services: Services, body: ConflictClose | None = None) -> ConflictClosed:
    """Mark an open conflict as no contradiction after all."""
    return _close(conflict_id, "dismissed", caller, services, resolution=body.resolution if body else None)


@router.post("/{conflict_id}/keep", response_model=ConflictClosed)
def keep(conflict_id: UUID, body: ConflictKeep, caller: Caller, services: Services) -> ConflictClosed:
    """Settle an open conflict by keeping side ``a`` or ``b`` (the other is rejected: kept with its
    versions, never recalled) or ``both`` (both confirmed); the conflict is resolved."""
    return _close(conflict_id, "resolved", caller, services, resolution=body.resolution, keep=body.keep)
