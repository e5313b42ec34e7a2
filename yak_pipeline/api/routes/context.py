"""``/api/context``: the memory block to put in the next prompt."""

from __future__ import annotations

import time

from fastapi import APIRouter

from yak_pipeline.api.dependencies import Caller, Services
from yak_pipeline.api.schemas.recall import ContextOut, ContextRequest
from yak_pipeline.services.memories import user_has_memories
from yak_pipeline.services.recall import block_choice, build_context

router = APIRouter(prefix="/api/context", tags=["recall"])


@router.post("", response_model=ContextOut)
def context(body: ContextRequest, caller: Caller, services: Services) -> ContextOut:
    """Recall for a query and render the memories as one isolated ``<memories>`` block, with the
    prompt messages around it (system prompt, block, query). If recall fails, the prompt is
    still built, without memories, and ``recall_error`` says why; ``note`` says so when the user
    has no memories at all."""
    user_id = caller.acting_for(body.user_id)
    started = time.perf_counter()
    block, built = build_context(services.database, services.embedder, user_id=user_id, query=body.query,
                                 params=services.recall_params(threshold=body.threshold, limit=body.limit),
                                 model=services.relevance_model,
                                 system_prompt=body.system_prompt, as_of=body.as_of, judge=services.judge,
                                 choice=block_choice(services.settings))
    services.metrics.observe_recall((time.perf_counter() - started) * 1000)
    note = None
    if not built.recalled_ids and not built.profile_ids and built.recall_error is None:
        # Still 200 with a prompt (an assistant's first turn with a new user must work), but a
        # mistyped user id should not look the same as "nothing relevant".
        if not user_has_memories(services.database, user_id):
            note = f"user {user_id!r} has no memories"
    return ContextOut(block=block, recalled_ids=built.recalled_ids, profile_ids=built.profile_ids, messages=built.messages,
                      recall_error=built.recall_error, note=note)


router.add_api_route("/", context, methods=["POST"], response_model=ContextOut, include_in_schema=False)
