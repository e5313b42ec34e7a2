"""``/api/forget``: explicit forget commands (DESIGN §4); an id deletes, a phrase asks first."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from yak_pipeline.api.dependencies import Caller, Services
from yak_pipeline.api.errors import one_line
from yak_pipeline.api.schemas import ForgetCandidate, ForgetConfirm, ForgetRequest, ForgetResult, rows_to
from yak_pipeline.core.forget import ForgetByIds, ForgetCommandError, parse_forget_command
from yak_pipeline.store.forget import find_forget_candidates, forget_memories, resolve_memory_ids
from yak_pipeline.store.forget_tokens import issue_forget_token, redeem_forget_token

router = APIRouter(prefix="/api/forget", tags=["forget"])


def _command_error(reason: str) -> HTTPException:
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, f"command: {one_line(reason)}")


@router.post("", response_model=ForgetResult)
def forget(body: ForgetRequest, caller: Caller, services: Services) -> ForgetResult:
    """Carry out a forget command. ``/forget <id>``, ``delete memory: <id>`` and ``forget this
    memory`` delete at once (memory or distillation ids; cascade and audit). ``/forget <phrase>``
    deletes nothing: it returns the matching memories and a token for ``/api/forget/confirm``."""
    user_id = caller.acting_for(body.user_id)
    try:
        command = parse_forget_command(body.command, body.context_memory_id)
    except ForgetCommandError as exc:
        raise _command_error(str(exc)) from None
    if command is None:
        raise _command_error("not a forget command; use '/forget <id or phrase>', 'delete memory: <id>' "
                             "or 'forget this memory'")
    with services.database.connection() as conn:
        if isinstance(command, ForgetByIds):
            memory_ids = resolve_memory_ids(conn, user_id=user_id, ids=command.ids)
            if not memory_ids:
                raise HTTPException(status.HTTP_404_NOT_FOUND, f"no memory {', '.join(command.ids)}")
            report = forget_memories(conn, user_id=user_id, memory_ids=memory_ids, actor=caller.actor,
                                     soft=body.soft)
            gone = set(report.memory_ids) | set(report.distillation_ids)
            return ForgetResult(action="deleted", deleted_memory_ids=report.memory_ids,
                                deleted_distillation_ids=report.distillation_ids,
                                not_found=[i for i in command.ids if i not in gone])
        candidates = find_forget_candidates(conn, user_id=user_id, phrase=command.phrase)
        if not candidates:
            return ForgetResult(action="nothing")
        token = issue_forget_token(conn, user_id=user_id, memory_ids=[c["memory_id"] for c in candidates])
    return ForgetResult(action="confirm", candidates=rows_to(ForgetCandidate, [
        {**c, "distillations": c["distillations"] or []} for c in candidates]),
        confirmation_token=token.token, expires_at=token.expires_at)


@router.post("/confirm", response_model=ForgetResult)
def confirm(body: ForgetConfirm, caller: Caller, services: Services) -> ForgetResult:
    """Delete the candidates a ``/forget <phrase>`` listed. The token works once, for ten minutes,
    for the user it was issued to, and only for the memories it listed."""
    user_id = caller.acting_for(body.user_id)
    with services.database.connection() as conn:
        redeemed = redeem_forget_token(conn, body.token, user_id=user_id)
        if redeemed is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, "unknown, used or expired confirmation token")
        _, memory_ids = redeemed
        report = forget_memories(conn, user_id=user_id, memory_ids=memory_ids, actor=caller.actor, soft=body.soft)
    return ForgetResult(action="deleted", deleted_memory_ids=report.memory_ids,
                        deleted_distillation_ids=report.distillation_ids,
                        not_found=sorted(set(memory_ids) - set(report.memory_ids)))
