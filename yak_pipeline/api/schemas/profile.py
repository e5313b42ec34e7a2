"""Bodies of ``/api/profile``: the user's standing instructions and preferences."""

from __future__ import annotations

from datetime import datetime
from typing import Literal
from uuid import UUID

from pydantic import BaseModel, Field

from yak_pipeline.api.schemas.base import RequestBody, UserId


class ProfileLineOut(BaseModel):
    """One of the user's standing instructions or preferences, as they said it."""

    id: UUID
    memory_id: UUID = Field(description="The exchange it was said in (forgetting that memory removes the line).")
    kind: Literal["instruction", "preference"]
    text: str
    said_at: datetime
    dropped: bool = Field(description="The user took it out of the profile; the exchange stays a memory.")
    sent: bool | None = Field(default=None, description="Whether every block carries it now.")
    why_not_sent: str | None = None


class ProfileOut(BaseModel):
    """What every memory block of the user carries (``sent``, in order) and every profile line."""

    token_budget: int = Field(description="YAK_PROFILE_TOKENS: the profile part's budget (0: off).")
    sent: list[ProfileLineOut]
    lines: list[ProfileLineOut]


class ProfileDrop(RequestBody):
    """Take lines out of the user's profile (or, with ``keep``, put them back)."""

    user_id: UserId
    ids: list[UUID] = Field(min_length=1, max_length=200)
    keep: bool = Field(default=False, description="Put the lines back into the profile instead.")


class ProfileDropOut(BaseModel):
    """The lines whose status changed."""

    changed: list[UUID]
