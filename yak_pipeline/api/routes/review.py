"""``/api/review``: the distillations waiting for a person, and their decisions."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, HTTPException, Query, status

from yak_pipeline.api.dependencies import Caller, Services
from yak_pipeline.api.schemas.base import UserId, rows_to
from yak_pipeline.api.schemas.curation import ReviewDecision, ReviewItem
from yak_pipeline.services.curation import ReviewOutcome, review
from yak_pipeline.services.curation import review_queue as list_review_queue

router = APIRouter(prefix="/api/review", tags=["review"])


def _decided(distillation_id: UUID, outcome: ReviewOutcome) -> ReviewDecision:
    if outcome == "not_found":
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"distillation {distillation_id} not found")
    if outcome == "not_flagged":
        raise HTTPException(status.HTTP_409_CONFLICT, f"distillation {distillation_id} is not waiting for review")
    return ReviewDecision(id=distillation_id, decision=outcome)


@router.get("", response_model=list[ReviewItem])
def review_queue(
    caller: Caller,
    services: Services,
    user_id: Annotated[UserId | None, Query(description="Only this user's (a user key: its own).")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> list[ReviewItem]:
    """Flagged distillations, oldest first: held back under the 0.6 confidence gate, active but
    uncertain (0.6–0.8), or one side of a conflict."""
    rows = list_review_queue(services.database, user_id=caller.user_filter(user_id), limit=limit, offset=offset)
    return rows_to(ReviewItem, rows)


@router.post("/{distillation_id}/approve", response_model=ReviewDecision)
def approve(distillation_id: UUID, caller: Caller, services: Services) -> ReviewDecision:
    """Confirm a flagged distillation: it becomes active (recallable) and leaves the queue."""
    outcome = review(services.database, distillation_id, "approve", user_id=caller.scope, actor=caller.actor)
    return _decided(distillation_id, outcome)


@router.post("/{distillation_id}/reject", response_model=ReviewDecision)
def reject(distillation_id: UUID, caller: Caller, services: Services) -> ReviewDecision:
    """Turn a flagged distillation down: it is kept with its versions but never recalled."""
    outcome = review(services.database, distillation_id, "reject", user_id=caller.scope, actor=caller.actor)
    return _decided(distillation_id, outcome)
