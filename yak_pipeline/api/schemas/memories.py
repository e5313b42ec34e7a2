"""Bodies of ``/api/memories``: an exchange to remember, stored raw memories and their distillations."""

from __future__ import annotations

from datetime import date, datetime
from typing import Annotated
from uuid import UUID

from pydantic import BaseModel, Field

from yak_pipeline.api.schemas.base import EVENT_ON_HELP, MEMORY_TYPE_HELP, ExchangeTime, RequestBody, Text, UserId
from yak_pipeline.core.types import MemoryType


class MemoryCreate(RequestBody):
    """One exchange to remember, "User: …\\nAssistant: …" or any text."""

    content: Annotated[Text, Field(max_length=200_000)]
    user_id: UserId
    occurred_at: ExchangeTime | None = None


class MemoryOut(BaseModel):
    """A stored raw memory."""

    id: UUID
    content: str
    user_id: str
    created_at: datetime
    occurred_at: datetime
    status: str
    source: str


class DistillationSummary(BaseModel):
    """A distillation as listed under its memory."""

    id: UUID
    content: str
    confidence: float
    tier: str
    warmth: float
    status: str
    needs_review: bool
    memory_type: MemoryType = Field(default="fact", description=MEMORY_TYPE_HELP)
    event_on: date | None = Field(default=None, description=EVENT_ON_HELP)


class MemoryDetail(MemoryOut):
    """A memory with its processing state and its distillations."""

    attempts: int
    last_error: str | None
    distillations: list[DistillationSummary]


class MemoryPage(BaseModel):
    """One page of memories; ``next_offset`` is null on the last page."""

    items: list[MemoryOut]
    limit: int
    offset: int
    next_offset: int | None
