"""``/api/export``: a user's memory in a form to read and keep."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status
from fastapi.responses import PlainTextResponse

from yak_pipeline.api.dependencies import Caller, Services
from yak_pipeline.api.schemas.base import UserId
from yak_pipeline.services.memory_export import UnknownUser, memory_markdown

router = APIRouter(prefix="/api/export", tags=["memories"])


@router.get("/memory.md", response_class=PlainTextResponse,
            responses={200: {"content": {"text/markdown": {}}, "description": "The user's MEMORY.md."}})
def memory_md(
    caller: Caller,
    services: Services,
    user_id: Annotated[UserId | None, Query(description="Whose memory (a user key: its own; an admin key must say).")] = None,
) -> PlainTextResponse:
    """The user's MEMORY.md: their current knowledge, grouped by tier, each memory with its date,
    superseded ones and those held for review left out, in a stable order (two exports diff
    cleanly). Rebuilt from the database on every request; 404 for a user with no memories."""
    user = caller.user_filter(user_id)
    if user is None:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, "give user_id: whose MEMORY.md")
    try:
        text, _ = memory_markdown(services.database, user)
    except UnknownUser as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from None
    return PlainTextResponse(text, media_type="text/markdown; charset=utf-8")
