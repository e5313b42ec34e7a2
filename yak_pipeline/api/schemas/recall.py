"""Bodies of recall: ``/api/distillations/search`` (ranked memories) and ``/api/context`` (the memory block)."""

from __future__ import annotations

from datetime import date, datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import AfterValidator, AwareDatetime, BaseModel, Field

from yak_pipeline.api.schemas.base import EVENT_ON_HELP, MEMORY_TYPE_HELP, RequestBody, Text, UserId, storable
from yak_pipeline.core.exchanges import MAX_RECALL_QUERY_CHARS
from yak_pipeline.core.types import MemoryType


class SearchRequest(RequestBody):
    """A recall query for one user."""

    query: Annotated[Text, Field(max_length=MAX_RECALL_QUERY_CHARS)]
    user_id: UserId
    limit: int = Field(default=5, ge=1, le=100)
    threshold: float = Field(default=0.7, ge=0.0, le=1.0,
                             description="Relevance threshold t of DESIGN §4, on the calibrated relevance (docs/RECALL.md).")
    as_of: AwareDatetime | None = Field(
        default=None, description="Recall as of this moment: only what had happened by then, aged from then.")
    explain: bool = Field(default=False, description="Give each hit its score breakdown.")


class SearchHit(BaseModel):
    """One recalled memory, ranked by ``score``: a distillation, or what the user said (``kind`` raw)."""

    id: UUID
    kind: Literal["distilled", "raw"] = Field(
        default="distilled", description="distilled: a distillation (id is its id); raw: an exchange no active "
                                         "distillation holds, recalled as the user's own words (id is the memory's).")
    memory_id: UUID
    content: str = Field(description="The distillation, or for a raw hit what the user said.")
    reply: str | None = Field(default=None, description="A raw hit's assistant reply: context, not a fact about the user.")
    confidence: float | None = Field(description="The distiller's confidence; null for a raw hit.")
    tier: str
    memory_type: MemoryType | None = Field(default=None, description=MEMORY_TYPE_HELP + " Null for a raw hit "
                                                                                        "(not distilled, so not typed).")
    event_on: date | None = Field(default=None, description=EVENT_ON_HELP)
    warmth: float
    similarity: float = Field(description="The best raw cosine of the query to the memory or its exchange.")
    relevance: float = Field(description="Calibrated relevance in [0, 1] that the gate applies to.")
    score: float = Field(description="The recall order on the relevance scale, in [0, 1]: the relevance with "
                                     "recency, warmth and weight folded in (higher first).")
    rank_odds: float = Field(description="What recall orders by internally: odds(standing)^e × decay × "
                                         "(1 + warmth) × gravity (spans many orders of magnitude; shown "
                                         "capped at the largest finite float).")
    is_core: bool
    occurred_at: datetime
    superseded_by: UUID | None = Field(default=None, description="The newer memory that replaced this one.")
    in_conflict: bool = False
    explain: dict[str, Any] | None = Field(
        default=None, description="With explain: why in plain words, relevance and its legs, decay, warmth "
                                  "factor, gravity.")


class ContextRequest(SearchRequest):
    """A recall query whose memories are rendered as the prompt's memory block."""

    system_prompt: Annotated[str, Field(default="", max_length=100_000), AfterValidator(storable)]


class ContextOut(BaseModel):
    """The memory block (empty when nothing was recalled), the ids in it, and the prompt messages."""

    block: str
    recalled_ids: list[UUID]
    profile_ids: list[UUID] = Field(default_factory=list, description="The profile lines the block carries "
                                                                      "(GET /api/profile), apart from the recalled memories.")
    messages: list[dict[str, str]]
    recall_error: str | None
    note: str | None = Field(default=None, description="Why the block is empty when the user has no memories "
                                                       "at all (a new user, or a mistyped user id).")
