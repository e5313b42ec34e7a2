"""What a person changes on the page: review decisions, conflicts, pins and forgetting.

Each action is a POST form carrying the session's CSRF token, and calls the function the API's
route calls (same scoping: the user in the URL, checked against the key; same audit rows and
metrics), then redirects to a page that shows the result with a one-line note. Forgetting
always asks first: a confirmation page lists exactly what will be deleted.
"""

from __future__ import annotations

from typing import Annotated, Literal
from uuid import UUID

from fastapi import APIRouter, Form, Request, Response

from yak_pipeline.api.dependencies import Services
from yak_pipeline.api.ui.access import (
    PREFIX,
    CsrfToken,
    PageError,
    PageRoute,
    SignedIn,
    checked_form,
    redirect,
    render,
    user_page,
    user_url,
)
from yak_pipeline.core.forget import ForgetCommandError
from yak_pipeline.services.forget import confirm_forget, run_forget_command
from yak_pipeline.services.curation import MAX_USER_WEIGHT, close_conflict, keep_in_conflict, review, set_weight
from yak_pipeline.services.memories import memory_with_distillations

router = APIRouter(prefix=f"{PREFIX}/u/{{user_id}}", include_in_schema=False, route_class=PageRoute)

_REVIEW_NOTES = {"approved": "approved: it is recallable now", "rejected": "rejected: kept, never recalled",
                 "not_flagged": "that distillation is not waiting for review (any more)"}
_CONFLICT_NOTES = {"a": "kept the first side; the other is rejected", "b": "kept the second side; the other is rejected",
                   "both": "kept both sides", "dismiss": "dismissed: no contradiction"}


@router.post("/review/{distillation_id}/{decision}")
def review_decision(user_id: str, distillation_id: UUID, decision: Literal["approve", "reject"], visitor: SignedIn,
                    services: Services, csrf_token: CsrfToken = "") -> Response:
    """Approve or reject a flagged distillation (as ``POST /api/review/{id}/approve|reject``)."""
    user_page(visitor, user_id)
    checked_form(visitor, csrf_token)
    outcome = review(services.database, distillation_id, decision, user_id=user_id, actor=visitor.caller.actor)
    if outcome == "not_found":
        raise PageError(404, f"distillation {distillation_id} not found")
    visitor.session.flash = _REVIEW_NOTES[outcome]
    return redirect(user_url(user_id, "review"))


@router.post("/conflicts/{conflict_id}/{choice}")
def conflict_decision(user_id: str, conflict_id: UUID, choice: Literal["a", "b", "both", "dismiss"],
                      visitor: SignedIn, services: Services, csrf_token: CsrfToken = "") -> Response:
    """Keep one side, keep both, or dismiss (as ``POST /api/conflicts/{id}/keep|dismiss``)."""
    user_page(visitor, user_id)
    checked_form(visitor, csrf_token)
    if choice == "dismiss":
        done = close_conflict(services.database, conflict_id, status="dismissed", user_id=user_id,
                              actor=visitor.caller.actor)
    else:
        done = keep_in_conflict(services.database, conflict_id, keep=choice, user_id=user_id,
                                actor=visitor.caller.actor)
    if not done:
        raise PageError(404, f"no open conflict {conflict_id}")
    visitor.session.flash = _CONFLICT_NOTES[choice]
    return redirect(user_url(user_id, "conflicts"))


@router.post("/d/{distillation_id}/weight")
def pin(user_id: str, distillation_id: UUID, visitor: SignedIn, services: Services,
        user_weight: Annotated[float, Form(gt=0, le=MAX_USER_WEIGHT)], csrf_token: CsrfToken = "") -> Response:
    """Pin or unpin: set ``user_weight`` (as ``POST /api/distillations/{id}/weight``)."""
    user_page(visitor, user_id)
    checked_form(visitor, csrf_token)
    before = set_weight(services.database, distillation_id, user_weight=user_weight, user_id=user_id,
                        actor=visitor.caller.actor)
    if before is None:
        raise PageError(404, f"distillation {distillation_id} not found")
    visitor.session.flash = f"user_weight {before:g} → {user_weight:g}"
    return redirect(user_url(user_id, "d", distillation_id))


@router.get("/m/{memory_id}/forget")
def forget_memory_form(request: Request, user_id: str, memory_id: UUID, visitor: SignedIn,
                       services: Services) -> Response:
    """The confirmation step: the exchange and every distillation that forgetting it deletes."""
    user_page(visitor, user_id)
    found = memory_with_distillations(services.database, memory_id, user_id=user_id)
    if found is None:
        raise PageError(404, f"memory {memory_id} not found")
    memory, distillations = found
    return render(request, "forget_confirm.html", visitor=visitor, user_id=user_id,
                  candidates=[{"memory_id": memory["id"], "content": memory["content"],
                               "occurred_at": memory["occurred_at"],
                               "distillations": [d["content"] for d in distillations]}],
                  action=user_url(user_id, "m", memory_id, "forget"), token=None, section="recent")


@router.post("/m/{memory_id}/forget")
def forget_memory(user_id: str, memory_id: UUID, visitor: SignedIn, services: Services,
                  csrf_token: CsrfToken = "") -> Response:
    """Forget one memory after its confirmation page: ``/forget <id>`` through the forget service
    (cascade: exchange, distillations, versions, warmth events, conflicts; an audit row)."""
    user_page(visitor, user_id)
    checked_form(visitor, csrf_token)
    outcome = run_forget_command(services.database, user_id=user_id, command=f"/forget {memory_id}",
                                 actor=visitor.caller.actor)
    if outcome.action != "deleted":
        raise PageError(404, f"memory {memory_id} not found")
    visitor.session.flash = (f"forgot memory {memory_id} and {len(outcome.deleted_distillation_ids)} "
                             "distillation(s)")
    return redirect(user_url(user_id, "recent"))


@router.post("/forget")
def forget_phrase(request: Request, user_id: str, visitor: SignedIn, services: Services,
                  phrase: Annotated[str, Form(max_length=1_000)] = "", csrf_token: CsrfToken = "") -> Response:
    """Forget by phrase, step one: the memories matching it, and a single-use token to confirm
    them (``/forget <phrase>``, as the API and the proxy; nothing is deleted yet)."""
    user_page(visitor, user_id)
    checked_form(visitor, csrf_token)
    try:
        outcome = run_forget_command(services.database, user_id=user_id, command=f"/forget {phrase.strip()}",
                                     actor=visitor.caller.actor)
    except ForgetCommandError as exc:
        raise PageError(422, f"phrase: {exc}") from None
    if outcome.action != "confirm":
        visitor.session.flash = f"no memory matches {phrase.strip()!r}"
        return redirect(user_url(user_id, "recent"))
    return render(request, "forget_confirm.html", visitor=visitor, user_id=user_id, candidates=outcome.candidates,
                  action=user_url(user_id, "forget", "confirm"), token=outcome.token, section="recent")


@router.post("/forget/confirm")
def forget_phrase_confirm(user_id: str, visitor: SignedIn, services: Services,
                          token: Annotated[str, Form(max_length=200)] = "", csrf_token: CsrfToken = "") -> Response:
    """Forget by phrase, step two: delete exactly the memories the token listed."""
    user_page(visitor, user_id)
    checked_form(visitor, csrf_token)
    outcome = confirm_forget(services.database, user_id=user_id, token=token, actor=visitor.caller.actor)
    if outcome.action != "deleted":
        raise PageError(404, "this confirmation is unknown, used or expired; search the phrase again")
    visitor.session.flash = f"forgot {len(outcome.deleted_memory_ids)} memory(ies)"
    return redirect(user_url(user_id, "recent"))
