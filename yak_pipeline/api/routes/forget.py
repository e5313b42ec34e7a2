"""``/api/forget``: explicit forget commands (DESIGN §4); an id deletes, a phrase asks first."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from yak_pipeline.api.dependencies import Caller, Services
from yak_pipeline.api.errors import one_line
from yak_pipeline.api.schemas.base import rows_to
from yak_pipeline.api.schemas.forget import ForgetCandidate, ForgetConfirm, ForgetRequest, ForgetResult
from yak_pipeline.core.forget import ForgetCommandError
from yak_pipeline.services.forget import ForgetOutcome, confirm_forget, run_forget_command

router = APIRouter(prefix="/api/forget", tags=["forget"])


def _result(outcome: ForgetOutcome) -> ForgetResult:
    return ForgetResult(action=outcome.action, deleted_memory_ids=outcome.deleted_memory_ids,
                        deleted_distillation_ids=outcome.deleted_distillation_ids, not_found=outcome.not_found,
                        candidates=rows_to(ForgetCandidate, outcome.candidates),
                        confirmation_token=outcome.token, expires_at=outcome.expires_at)


@router.post("", response_model=ForgetResult)
def forget(body: ForgetRequest, caller: Caller, services: Services) -> ForgetResult:
    """Carry out a forget command. ``/forget <id>``, ``delete memory: <id>`` and ``forget this
    memory`` delete at once (memory or distillation ids; cascade and audit). ``/forget <phrase>``
    deletes nothing: it returns the matching memories and a token for ``/api/forget/confirm``."""
    user_id = caller.acting_for(body.user_id)
    try:
        outcome = run_forget_command(services.database, user_id=user_id, command=body.command,
                                     context_memory_id=body.context_memory_id, actor=caller.actor, soft=body.soft)
    except ForgetCommandError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, f"command: {one_line(exc)}") from None
    if outcome.action == "not_found":
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no memory {', '.join(outcome.not_found)}")
    return _result(outcome)


@router.post("/confirm", response_model=ForgetResult)
def confirm(body: ForgetConfirm, caller: Caller, services: Services) -> ForgetResult:
    """Delete the candidates a ``/forget <phrase>`` listed. The token works once, for ten minutes,
    for the user it was issued to, and only for the memories it listed."""
    user_id = caller.acting_for(body.user_id)
    outcome = confirm_forget(services.database, user_id=user_id, token=body.token, actor=caller.actor, soft=body.soft)
    if outcome.action == "not_found":
        raise HTTPException(status.HTTP_404_NOT_FOUND, "unknown, used or expired confirmation token")
    return _result(outcome)
