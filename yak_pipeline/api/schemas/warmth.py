"""Bodies of ``/api/turns`` (a finished turn, queued for warmth evaluation) and ``/api/warmth``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated
from uuid import UUID

from pydantic import BaseModel, Field

from yak_pipeline.api.schemas.base import ExchangeTime, RequestBody, Text, UserId
from yak_pipeline.core.exchanges import MAX_TURN_MESSAGE_CHARS


class TurnCreate(RequestBody):
    """One finished turn: stored as a memory and queued for per-turn warmth evaluation."""

    user_id: UserId
    user_message: Annotated[Text, Field(max_length=MAX_TURN_MESSAGE_CHARS)]
    assistant_message: Annotated[Text, Field(max_length=MAX_TURN_MESSAGE_CHARS)]
    recalled_ids: list[UUID] = Field(default_factory=list, max_length=200)
    occurred_at: ExchangeTime | None = None


class TurnAccepted(BaseModel):
    """The queued turn and the memory its exchange was stored as; ``queued`` false for a repeat."""

    turn_id: UUID
    memory_id: UUID
    queued: bool
    new_user: bool = Field(default=False, description="This turn is the user's first memory: the user id was "
                                                      "new to Yak (there is no user registry; check for a typo).")


class WarmthEvaluate(RequestBody):
    """Evaluate now how useful a recalled memory (a distillation id) was for ``context``."""

    memory_id: UUID
    context: Annotated[Text, Field(max_length=200_000)]
    evaluator: Annotated[str | None, Field(default=None, max_length=100)] = None


class WarmthEvaluation(BaseModel):
    """The evaluator's relevance score and the warmth change it caused."""

    memory_id: UUID
    relevance_score: float
    warmth_change: float
    new_warmth: float


class WarmthEvent(BaseModel):
    """One recorded warmth change."""

    relevance_score: float | None
    delta: float
    warmth_before: float
    warmth_after: float
    reason: str
    evaluator: str | None
    turn_id: UUID | None
    created_at: datetime


class WarmthOut(BaseModel):
    """A distillation's warmth and its latest changes, newest first."""

    memory_id: UUID
    warmth: float
    history: list[WarmthEvent]


class BulkWarmthReset(RequestBody):
    """Reset warmth to 0.5 for a user's distillations (all, or those listed)."""

    user_id: UserId
    memory_ids: list[UUID] | None = Field(default=None, max_length=10_000)


class WarmthResetOut(BaseModel):
    """How many distillations changed."""

    reset: int
