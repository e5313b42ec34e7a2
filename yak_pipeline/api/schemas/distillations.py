"""Bodies of ``/api/distillations``: a distillation's state and versions, and a person's edits to it."""

from __future__ import annotations

from datetime import date, datetime
from typing import Annotated
from uuid import UUID

from pydantic import BaseModel, Field

from yak_pipeline.api.schemas.base import EVENT_ON_HELP, MEMORY_TYPE_HELP, RequestBody, Text
from yak_pipeline.core.types import MemoryType, Tier


class DistillationOut(BaseModel):
    """A distillation's live state."""

    id: UUID
    memory_id: UUID
    user_id: str
    content: str
    confidence: float
    tier: str
    warmth: float
    user_weight: float
    status: str
    needs_review: bool
    embedding_model: str | None
    prompt_version: str
    created_at: datetime
    updated_at: datetime
    memory_type: MemoryType = Field(default="fact", description=MEMORY_TYPE_HELP)
    event_on: date | None = Field(default=None, description=EVENT_ON_HELP)
    superseded_by: UUID | None = Field(default=None, description=(
        "The newer distillation that replaced this one (a knowledge update): still recallable, ranked "
        "below it, and not counted among the active memories MEMORY.md lists."))


class VersionOut(BaseModel):
    """One version of a distillation's text."""

    version: int
    content: str
    reason: str
    merged_from: list[UUID]
    embedding_model: str | None
    prompt_version: str | None
    created_at: datetime


class DistillationDetail(DistillationOut):
    """A distillation with every version, oldest first."""

    versions: list[VersionOut]


class DistillationPage(BaseModel):
    """One page of distillations."""

    items: list[DistillationOut]
    limit: int
    offset: int
    next_offset: int | None


class ManualVersion(RequestBody):
    """New text for a distillation, written by a person; the old text stays as a version."""

    content: Annotated[Text, Field(max_length=4_000)]


class WeightUpdate(RequestBody):
    """A person's weight for a distillation (pin): a factor of recall's gravity; 1 is neutral."""

    user_weight: Annotated[float, Field(gt=0, le=10, description="Above 0, at most 10; e.g. 2 to pin, 1 to unpin.")]


class TierUpdate(RequestBody):
    """A person's importance tier for a distillation: recall's tier multiplier and relevance gate."""

    tier: Annotated[Tier, Field(description="core (weighs 2×, a looser gate), medium (1×) or low (0.5×, a stricter gate).")]


class TypeUpdate(RequestBody):
    """A person's type for a distillation (it does not change recall's ranking)."""

    memory_type: Annotated[MemoryType, Field(description="instruction, preference, fact or event (an event is dated "
                                                         "from its exchange's words).")]


class MergeRequest(RequestBody):
    """Merge ``merge_id`` into ``keep_id``: ``keep_id`` gets a version, ``merge_id`` becomes ``merged``."""

    keep_id: UUID
    merge_id: UUID
    content: Annotated[Text | None, Field(default=None, max_length=4_000,
                                          description="The merged text; default: the LLM consolidates both.")] = None
