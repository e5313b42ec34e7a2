"""Bodies of ``/api/review`` (distillations waiting for a decision) and ``/api/conflicts``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal
from uuid import UUID

from pydantic import AfterValidator, BaseModel, Field

from yak_pipeline.api.schemas.base import RequestBody, storable_or_none
from yak_pipeline.api.schemas.memories import DistillationSummary

# How a person settled a conflict, in their words (closing it, or keeping a side).
SettlementNote = Annotated[str | None, Field(default=None, max_length=1_000), AfterValidator(storable_or_none)]


class ReviewItem(DistillationSummary):
    """A distillation waiting for a person's decision."""

    memory_id: UUID
    user_id: str
    in_conflict: bool
    created_at: datetime


class ReviewDecision(BaseModel):
    """The outcome of approving or rejecting."""

    id: UUID
    decision: Literal["approved", "rejected"]


class ConflictOut(BaseModel):
    """Two of a user's distillations that contradict each other."""

    id: UUID
    user_id: str
    distillation_a: UUID
    content_a: str
    distillation_b: UUID
    content_b: str
    score: float
    status: str
    resolution: str | None
    created_at: datetime
    resolved_at: datetime | None
    said_a: datetime | None = Field(default=None, description="When side a was said (its exchange's time).")
    said_b: datetime | None = Field(default=None, description="When side b was said (its exchange's time).")


class ConflictClose(RequestBody):
    """An optional note on how the conflict was settled."""

    resolution: SettlementNote = None


class ConflictKeep(RequestBody):
    """Which side of a conflict to keep: ``a`` or ``b`` (the other is rejected) or ``both``."""

    keep: Literal["a", "b", "both"]
    resolution: SettlementNote = None


class ConflictClosed(BaseModel):
    """The conflict's new status."""

    id: UUID
    status: Literal["resolved", "dismissed"]
