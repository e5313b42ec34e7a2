"""``/api/warmth``: evaluate a recalled memory now, show warmth and its history, reset it."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, HTTPException, Query, status

from yak_pipeline.api.dependencies import Caller, Services
from yak_pipeline.api.errors import one_line
from yak_pipeline.api.schemas.base import rows_to
from yak_pipeline.api.schemas.warmth import (
    BulkWarmthReset,
    WarmthEvaluate,
    WarmthEvaluation,
    WarmthEvent,
    WarmthOut,
    WarmthResetOut,
)
from yak_pipeline.llm.errors import LLMError
from yak_pipeline.services.warmth import evaluate_now, offline_judge, reset_warmth_of, warmth_of

router = APIRouter(prefix="/api/warmth", tags=["warmth"])


@router.post("/evaluate", response_model=WarmthEvaluation)
def evaluate(body: WarmthEvaluate, caller: Caller, services: Services) -> WarmthEvaluation:
    """Score now how useful a recalled memory was for ``context`` and apply the warmth rule
    (> 0.7: +0.1, < 0.3: −0.2, clamped to [0, 1]); the same function as the warmth asset."""
    try:
        update = evaluate_now(services.database, services.llm, distillation_id=str(body.memory_id),
                              context=body.context, evaluator=body.evaluator, user_id=caller.scope,
                              judge=offline_judge(services))
    except LLMError as exc:
        services.metrics.count_error("llm_unavailable")
        raise HTTPException(status.HTTP_502_BAD_GATEWAY, f"the evaluator failed: {one_line(exc.reason)}") from None
    if update is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"memory {body.memory_id} not found")
    return WarmthEvaluation(memory_id=body.memory_id, relevance_score=update.relevance_score,
                            warmth_change=update.change.delta, new_warmth=update.change.after)


@router.post("/bulk-reset", response_model=WarmthResetOut)
def bulk_reset(body: BulkWarmthReset, caller: Caller, services: Services) -> WarmthResetOut:
    """Reset warmth to 0.5 for all of a user's distillations, or the listed ones of that user."""
    user_id = caller.acting_for(body.user_id)
    count = reset_warmth_of(services.database, None if body.memory_ids is None else [str(i) for i in body.memory_ids],
                            user_id=user_id, actor=caller.actor)
    return WarmthResetOut(reset=count)


@router.get("/{memory_id}", response_model=WarmthOut)
def show(memory_id: UUID, caller: Caller, services: Services,
         limit: Annotated[int, Query(ge=1, le=500)] = 50) -> WarmthOut:
    """A distillation's warmth and its latest changes, newest first."""
    found = warmth_of(services.database, memory_id, user_id=caller.scope, limit=limit)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"memory {memory_id} not found")
    warmth, history = found
    return WarmthOut(memory_id=memory_id, warmth=warmth, history=rows_to(WarmthEvent, history))


@router.post("/{memory_id}/reset", response_model=WarmthOut)
def reset(memory_id: UUID, caller: Caller, services: Services) -> WarmthOut:
    """Set a distillation's warmth back to 0.5 (recorded as a warmth event)."""
    found = warmth_of(services.database, memory_id, user_id=caller.scope, reset=True, actor=caller.actor)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"memory {memory_id} not found")
    warmth, history = found
    return WarmthOut(memory_id=memory_id, warmth=warmth, history=rows_to(WarmthEvent, history))
