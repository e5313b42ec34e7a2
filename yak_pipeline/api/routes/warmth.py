"""``/api/warmth``: evaluate a recalled memory now, show warmth and its history, reset it."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, HTTPException, Query, status

from yak_pipeline.api.dependencies import Caller, Services
from yak_pipeline.api.errors import one_line
from yak_pipeline.api.schemas import (
    BulkWarmthReset,
    WarmthEvaluate,
    WarmthEvaluation,
    WarmthEvent,
    WarmthOut,
    WarmthResetOut,
    rows_to,
)
from yak_pipeline.core.warmth import WARMTH_DEFAULT
from yak_pipeline.llm.errors import LLMError
from yak_pipeline.services.warmth import evaluate_relevance, offline_judge
from yak_pipeline.store.distillations import get_distillation
from yak_pipeline.store.warmth import reset_warmth, warmth_history

router = APIRouter(prefix="/api/warmth", tags=["warmth"])


@router.post("/evaluate", response_model=WarmthEvaluation)
def evaluate(body: WarmthEvaluate, caller: Caller, services: Services) -> WarmthEvaluation:
    """Score now how useful a recalled memory was for ``context`` and apply the warmth rule
    (> 0.7: +0.1, < 0.3: −0.2, clamped to [0, 1]); the same function as the warmth asset."""
    try:
        with services.database.connection() as conn:
            update = evaluate_relevance(conn, services.llm, distillation_id=str(body.memory_id), context=body.context,
                                        reason="manual", evaluator=body.evaluator, user_id=caller.scope,
                                        judge=offline_judge(services.settings, services.llm, services.embedder))
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
    with services.database.connection() as conn:
        count = reset_warmth(conn, None if body.memory_ids is None else [str(i) for i in body.memory_ids],
                             user_id=user_id, actor=caller.actor)
    return WarmthResetOut(reset=count)


@router.get("/{memory_id}", response_model=WarmthOut)
def show(memory_id: UUID, caller: Caller, services: Services,
         limit: Annotated[int, Query(ge=1, le=500)] = 50) -> WarmthOut:
    """A distillation's warmth and its latest changes, newest first."""
    with services.database.connection() as conn:
        row = get_distillation(conn, memory_id, user_id=caller.scope)
        if row is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"memory {memory_id} not found")
        history = warmth_history(conn, memory_id, limit=limit)
    return WarmthOut(memory_id=memory_id, warmth=row["warmth"], history=rows_to(WarmthEvent, history))


@router.post("/{memory_id}/reset", response_model=WarmthOut)
def reset(memory_id: UUID, caller: Caller, services: Services) -> WarmthOut:
    """Set a distillation's warmth back to 0.5 (recorded as a warmth event)."""
    with services.database.connection() as conn:
        row = get_distillation(conn, memory_id, user_id=caller.scope)
        if row is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"memory {memory_id} not found")
        reset_warmth(conn, [str(memory_id)], user_id=row["user_id"], actor=caller.actor)
        history = warmth_history(conn, memory_id, limit=50)
    return WarmthOut(memory_id=memory_id, warmth=WARMTH_DEFAULT, history=rows_to(WarmthEvent, history))
