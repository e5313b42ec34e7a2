"""Explicit forget commands (DESIGN §4), carried out: an id deletes, a phrase asks first.

The API's ``/api/forget`` routes and the memory proxy's chat commands both come through here,
so a command means the same wherever it is typed: the same parsing (``core.forget``), the same
candidates, the same single-use confirmation token, the same cascade and audit row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from yak_pipeline.core.forget import ForgetByIds, ForgetCommandError, parse_forget_command
from yak_pipeline.store.database import Database
from yak_pipeline.store.forget import find_forget_candidates, forget_memories, resolve_memory_ids
from yak_pipeline.store.forget_tokens import issue_forget_token, redeem_forget_token

NOT_A_COMMAND = ("not a forget command; use '/forget <id or phrase>', 'delete memory: <id>' "
                 "or 'forget this memory'")


@dataclass(frozen=True)
class ForgetOutcome:
    """What a forget command did.

    ``deleted``: these rows are gone (``not_found`` lists given ids that were not the user's).
    ``confirm``: nothing deleted yet; ``candidates`` match the phrase and ``token`` confirms them.
    ``nothing``: the phrase matched no memory. ``not_found``: no given id was the user's, or the
    confirmation token is unknown, used or expired.
    """

    action: Literal["deleted", "confirm", "nothing", "not_found"]
    deleted_memory_ids: list[str] = field(default_factory=list)
    deleted_distillation_ids: list[str] = field(default_factory=list)
    not_found: list[str] = field(default_factory=list)
    candidates: list[dict[str, Any]] = field(default_factory=list)
    token: str | None = None
    expires_at: datetime | None = None


def run_forget_command(db: Database, *, user_id: str, command: str, context_memory_id: str | None = None,
                       actor: str, soft: bool = False) -> ForgetOutcome:
    """Carry out ``command`` for ``user_id``.

    Raises :class:`~yak_pipeline.core.forget.ForgetCommandError` (a one-line reason) when the text
    is not a forget command or cannot be carried out as written.
    """
    parsed = parse_forget_command(command, context_memory_id)
    if parsed is None:
        raise ForgetCommandError(NOT_A_COMMAND)
    with db.connection() as conn:
        if isinstance(parsed, ForgetByIds):
            memory_ids = resolve_memory_ids(conn, user_id=user_id, ids=parsed.ids)
            if not memory_ids:
                return ForgetOutcome("not_found", not_found=list(parsed.ids))
            report = forget_memories(conn, user_id=user_id, memory_ids=memory_ids, actor=actor, soft=soft)
            gone = set(report.memory_ids) | set(report.distillation_ids)
            return ForgetOutcome("deleted", deleted_memory_ids=report.memory_ids,
                                 deleted_distillation_ids=report.distillation_ids,
                                 not_found=[i for i in parsed.ids if i not in gone])
        candidates = find_forget_candidates(conn, user_id=user_id, phrase=parsed.phrase)
        if not candidates:
            return ForgetOutcome("nothing")
        token = issue_forget_token(conn, user_id=user_id, memory_ids=[c["memory_id"] for c in candidates])
    return ForgetOutcome("confirm", candidates=[{**c, "distillations": c["distillations"] or []} for c in candidates],
                         token=token.token, expires_at=token.expires_at)


def confirm_forget(db: Database, *, user_id: str, token: str, actor: str, soft: bool = False) -> ForgetOutcome:
    """Delete the candidates a phrase listed; ``not_found`` when the token is unknown, used, expired
    or another user's. A token works once, for ten minutes, and only for the memories it listed."""
    with db.connection() as conn:
        redeemed = redeem_forget_token(conn, token, user_id=user_id)
        if redeemed is None:
            return ForgetOutcome("not_found")
        memory_ids = redeemed.memory_ids
        report = forget_memories(conn, user_id=user_id, memory_ids=memory_ids, actor=actor, soft=soft)
    return ForgetOutcome("deleted", deleted_memory_ids=report.memory_ids,
                         deleted_distillation_ids=report.distillation_ids,
                         not_found=sorted(set(memory_ids) - set(report.memory_ids)))
