"""``/api/turns``: a finished turn, queued for per-turn warmth evaluation."""

from __future__ import annotations

from fastapi import APIRouter, status

from yak_pipeline.api.dependencies import Caller, Services
from yak_pipeline.api.schemas.warmth import TurnAccepted, TurnCreate
from yak_pipeline.services.memories import record_turn, user_has_memories

router = APIRouter(prefix="/api/turns", tags=["turns"])


@router.post("", response_model=TurnAccepted, status_code=status.HTTP_202_ACCEPTED)
def post_turn(body: TurnCreate, caller: Caller, services: Services) -> TurnAccepted:
    """Store the turn's exchange as a memory (distilled later) and queue the turn so the pipeline
    evaluates how useful each recalled memory was. Recalled ids that are not the user's are
    dropped. Posting the same exchange again queues nothing new.

    Yak has no user registry: a turn for a user id it has never seen stores that user's first
    memory (with a user-scoped key the id is the key's own). ``new_user`` is then true, so a
    client can catch a mistyped id."""
    user_id = caller.acting_for(body.user_id)
    # Asked before the turn is stored (the proxy, which never reports it, does not ask at all).
    known = user_has_memories(services.database, user_id)
    stored = record_turn(services.database, user_id=user_id, user_message=body.user_message,
                         assistant_message=body.assistant_message, recalled_ids=body.recalled_ids,
                         occurred_at=body.occurred_at, actor=caller.actor, embedder=services.embedder)
    return TurnAccepted(turn_id=stored.turn_id, memory_id=stored.memory_id, queued=stored.created,
                        new_user=not known)


router.add_api_route("/", post_turn, methods=["POST"], response_model=TurnAccepted,
                     status_code=status.HTTP_202_ACCEPTED, include_in_schema=False)
