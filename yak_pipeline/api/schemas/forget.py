"""Bodies of ``/api/forget``: explicit forget commands (DESIGN §4), their candidates and confirmation."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal
from uuid import UUID

from pydantic import BaseModel, Field

from yak_pipeline.api.schemas.base import RequestBody, Text, UserId


class ForgetRequest(RequestBody):
    """An explicit forget command (DESIGN §4): ``/forget <id>``, ``/forget <phrase>``,
    ``forget this memory`` (with ``context_memory_id``) or ``delete memory: <id>``."""

    command: Annotated[Text, Field(max_length=2_000)]
    user_id: UserId
    context_memory_id: Annotated[str | None, Field(default=None, max_length=64)] = None
    soft: bool = Field(default=False, description="Keep the rows but hide them from every read path.")


class ForgetConfirm(RequestBody):
    """Confirm a forget by phrase with the token it returned."""

    token: Annotated[str, Field(min_length=16, max_length=200)]
    user_id: UserId
    soft: bool = False


class ForgetCandidate(BaseModel):
    """A memory that contains the phrase."""

    memory_id: UUID
    occurred_at: datetime
    content: str
    distillations: list[str]


class ForgetResult(BaseModel):
    """``deleted``: these rows are gone. ``confirm``: candidates to confirm with the token.
    ``nothing``: the phrase matched no memory."""

    action: Literal["deleted", "confirm", "nothing"]
    deleted_memory_ids: list[UUID] = Field(default_factory=list)
    deleted_distillation_ids: list[UUID] = Field(default_factory=list)
    not_found: list[str] = Field(default_factory=list)
    candidates: list[ForgetCandidate] = Field(default_factory=list)
    confirmation_token: str | None = None
    expires_at: datetime | None = None
