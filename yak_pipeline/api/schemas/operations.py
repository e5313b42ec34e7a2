"""Bodies of operations: ``/health``, ``/api/queue`` (what waits, failed, quarantined) and ``/api/keys``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal
from uuid import UUID

from pydantic import BaseModel, Field, model_validator

from yak_pipeline.api.schemas.base import RequestBody, UserId


class ComponentHealth(BaseModel):
    """Whether one dependency answered, and a short note."""

    ok: bool
    detail: str


class HealthOut(BaseModel):
    """``ok`` when every dependency answered, else ``degraded``."""

    status: Literal["ok", "degraded"]
    database: ComponentHealth
    embedder: ComponentHealth
    llm: ComponentHealth


class FailedItem(BaseModel):
    """A memory or turn whose processing failed (retrying, or given up)."""

    kind: Literal["memory", "turn"]
    id: UUID
    user_id: str
    status: str
    attempts: int
    last_error: str | None
    created_at: datetime


class QuarantinedItem(BaseModel):
    """A file in the drop folder's ``failed/``: a whole file Yak could not read (``file``), or the
    rejected records of an otherwise good file (``records``), with the reasons from its error file."""

    name: str
    kind: Literal["file", "records"]
    records: int
    reasons: list[str]
    quarantined_at: datetime


class QuarantineOut(BaseModel):
    """The drop folder's quarantine: counts, and the latest entries (newest first)."""

    folder: str
    files: int = Field(description="Whole files that could not be read.")
    records: int = Field(description="Rejected records kept from otherwise good files.")
    items: list[QuarantinedItem]


class QueueOut(BaseModel):
    """What waits for the pipeline, and what failed."""

    pending_memories: int
    pending_turns: int
    failed_memories: int
    failed_turns: int
    unembedded_memories: int = Field(
        default=0, description="Memories still without their vectors (recallable by their words meanwhile): "
                               "an import's are made in the background after `yak import` returns.")
    failed: list[FailedItem]
    quarantine: QuarantineOut | None = Field(
        default=None, description="What the drop folder refused, with reasons (admin keys only: a file can hold "
                                  "several users' records; not filtered by user_id).")


class KeyCreate(RequestBody):
    """A new key: scoped to ``user_id``, or ``admin``."""

    user_id: UserId | None = None
    admin: bool = False
    label: Annotated[str | None, Field(default=None, max_length=200)] = None
    read_only: bool = Field(default=False, description="The key may recall and search, never write or forget.")

    @model_validator(mode="after")
    def _one_kind(self) -> KeyCreate:
        if self.admin == (self.user_id is not None):
            raise ValueError("give either user_id or admin=true")
        return self


class KeyOut(BaseModel):
    """A stored key (the key itself is never shown again)."""

    id: UUID
    prefix: str
    user_id: str | None
    admin: bool
    label: str | None
    created_at: datetime
    revoked_at: datetime | None
    read_only: bool = False


class KeyCreated(KeyOut):
    """A new key, shown this once."""

    key: str
