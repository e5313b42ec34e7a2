"""What a person changes on the page: adding a memory, a distillation's text, tier and type, review
decisions, conflicts, pins and forgetting.

Each action is a POST form carrying the session's CSRF token, and calls the function the API's
route calls (same scoping: the user in the URL, checked against the key; same audit rows and
metrics), then redirects to a page that shows the result with a one-line note. Forgetting
always asks first: a confirmation page lists exactly what will be deleted. Text a person typed
is checked by the API's own request models; when refused, the same page comes back with the
text still in its box and one line saying why.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, datetime, time
from typing import Annotated, Literal, TypeVar
from uuid import UUID
from zoneinfo import ZoneInfo

from fastapi import APIRouter, Form, Request, Response
from pydantic import ValidationError

from yak_pipeline.api.dependencies import Services
from yak_pipeline.api.errors import one_line
from yak_pipeline.api.schemas.distillations import ManualVersion
from yak_pipeline.api.schemas.memories import MemoryCreate
from yak_pipeline.api.ui.access import (
    PREFIX,
    CsrfToken,
    PageError,
    PageRoute,
    SignedIn,
    Visitor,
    checked_form,
    redirect,
    render,
    user_page,
    user_url,
)
from yak_pipeline.api.ui.views import render_distillation, render_overview
from yak_pipeline.core.forget import ForgetCommandError
from yak_pipeline.core.types import MemoryType, Tier
from yak_pipeline.core.wording import plural, weight_note
from yak_pipeline.embeddings import EmbeddingError
from yak_pipeline.services.curation import (
    MAX_USER_WEIGHT,
    close_conflict,
    review,
    set_memory_type,
    set_tier,
    set_weight,
    write_manual_version,
)
from yak_pipeline.services.forget import confirm_forget, run_forget_command
from yak_pipeline.services.memories import ExchangeForgotten, memory_with_distillations, store_memory
from yak_pipeline.services.profile import drop_profile_lines

T = TypeVar("T")

router = APIRouter(prefix=f"{PREFIX}/u/{{user_id}}", include_in_schema=False, route_class=PageRoute)

_REVIEW_NOTES = {"approved": "approved: it is recallable now", "rejected": "rejected: kept, never recalled",
                 "not_flagged": "that distillation is not waiting for review (any more)"}
_CONFLICT_NOTES = {"a": "kept the first side; the other is rejected", "b": "kept the second side; the other is rejected",
                   "both": "kept both sides", "dismiss": "dismissed: no contradiction"}


def _refusal(exc: ValidationError) -> str:
    """The first reason a request model refused the text, as one line (``content: must not be blank``)."""
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first.get("loc", ())) or "text"
    if first.get("type") == "too_long":  # pydantic says "items after validation": count characters instead
        ctx = first.get("ctx", {})
        return f"{field}: at most {ctx.get('max_length')} characters, this has {ctx.get('actual_length')}"
    return f"{field}: {one_line(first.get('msg', 'invalid')).removeprefix('Value error, ')}"


def _said_at(said_on: str, time_zone: str) -> datetime | None:
    """The day a person says a memory was said, as noon of that day in Yak's time zone (a day has
    no hour; noon keeps it on that date in every nearby zone); None for no day. ``ValueError``
    when it is not a date."""
    if not said_on.strip():
        return None
    return datetime.combine(date.fromisoformat(said_on.strip()), time(12), ZoneInfo(time_zone))


@router.post("/memories")
def add_memory(request: Request, user_id: str, visitor: SignedIn, services: Services,
               content: Annotated[str, Form()] = "", said_on: Annotated[str, Form(max_length=40)] = "",
               csrf_token: CsrfToken = "") -> Response:
    """Add a memory: a plain sentence the user said, or "User: …" and "Assistant: …" lines, and
    optionally the day it was said (as ``yak memory add [--occurred-at]`` and ``POST
    /api/memories/``, through the same service: stored as pending, embedded at once, so it is
    recallable before the pipeline distils it)."""
    user_page(visitor, user_id)
    checked_form(visitor, csrf_token)
    # A browser sends a textarea's line breaks as CRLF: the same text typed on the CLI or posted
    # to the API must be the same memory (its hash) with the same "User:/Assistant:" lines.
    content = content.replace("\r\n", "\n")
    try:
        occurred_at = _said_at(said_on, services.settings.timezone)
        body = MemoryCreate(content=content, user_id=user_id, occurred_at=occurred_at)
    except ValidationError as exc:
        return render_overview(request, visitor, services, user_id, draft=content, said_on=said_on,
                               error=_refusal(exc).replace("occurred_at:", "said on:"), status_code=422)
    except ValueError:
        return render_overview(request, visitor, services, user_id, draft=content, said_on=said_on,
                               error=f"said on: {said_on.strip()!r} is not a date (YYYY-MM-DD)", status_code=422)
    try:
        created, row = store_memory(services.database, user_id=user_id, content=body.content, source="api",
                                    occurred_at=body.occurred_at, actor=visitor.caller.actor,
                                    embedder=services.embedder)
    except ExchangeForgotten as exc:
        return render_overview(request, visitor, services, user_id, draft=content, said_on=said_on,
                               error=str(exc), status_code=409)
    visitor.session.flash = ("added: recallable now; the pipeline distils it next" if created
                             else f"already stored on {row['created_at']:%Y-%m-%d}: the same text is kept once")
    return redirect(user_url(user_id, "recent"))


@router.post("/d/{distillation_id}/text")
def edit_text(request: Request, user_id: str, distillation_id: UUID, visitor: SignedIn, services: Services,
              content: Annotated[str, Form()] = "", csrf_token: CsrfToken = "") -> Response:
    """Give a distillation new text: a new version (as ``yak distill version`` and ``POST
    /api/distillations/{id}/versions``, audited); the old text stays in the version history."""
    user_page(visitor, user_id)
    checked_form(visitor, csrf_token)
    content = content.replace("\r\n", "\n")  # a textarea's CRLF, as in add_memory
    try:
        body = ManualVersion(content=content)
    except ValidationError as exc:
        return render_distillation(request, visitor, services, user_id, distillation_id, draft=content,
                                   error=_refusal(exc), status_code=422)
    try:
        found = write_manual_version(services.database, services.embedder, distillation_id, content=body.content,
                                     user_id=user_id, actor=visitor.caller.actor)
    except EmbeddingError as exc:
        # The new text needs its vector before it is stored (recall must find it by meaning): nothing
        # was written, and the person's text stays in the editor to try again.
        return render_distillation(request, visitor, services, user_id, distillation_id, draft=content,
                                   error=f"not saved, the embedder failed: {one_line(exc)}; try again",
                                   status_code=503)
    if not found:
        raise PageError(404, f"distillation {distillation_id} not found")
    visitor.session.flash = "saved as a new version: the old text stays in the version history"
    return redirect(user_url(user_id, "d", distillation_id))


@router.post("/profile/{line_id}")
def drop_profile_line(user_id: str, line_id: UUID, visitor: SignedIn, services: Services,
                      keep: Annotated[bool, Form()] = False, csrf_token: CsrfToken = "") -> Response:
    """Take a line out of the profile (``keep``: put it back), as ``yak profile drop`` and ``POST
    /api/profile/drop``; the exchange stays a memory."""
    user_page(visitor, user_id)
    checked_form(visitor, csrf_token)
    changed = drop_profile_lines(services.database, user_id, [str(line_id)], actor=visitor.caller.actor, keep=keep)
    visitor.session.flash = ("unchanged: that line is not in this profile" + ("" if keep else " (any more)")
                             if not changed else "put back: every block carries it again" if keep
                             else "dropped from the profile: blocks no longer carry it (the memory stays)")
    return redirect(user_url(user_id, "profile"))


def _change_note(what: str, before: str, now: str) -> str:
    """The flash after setting a distillation's ``what`` (its tier, its type) from ``before`` to ``now``."""
    return f"{what} is {now} now (was {before})" if before != now else f"unchanged: the {what} already is {now}"


def _changed_distillation(user_id: str, distillation_id: UUID, visitor: Visitor, csrf_token: str,
                          change: Callable[[str], T | None], note: Callable[[T], str]) -> Response:
    """One audited change of a distillation from its page's form (its tier, type or weight): ``change``
    (given the actor) returns what was there before, None when the user has no such distillation
    (a 404 page); ``note(before)`` is the flash on the distillation's page it redirects to."""
    user_page(visitor, user_id)
    checked_form(visitor, csrf_token)
    before = change(visitor.caller.actor)
    if before is None:
        raise PageError(404, f"distillation {distillation_id} not found")
    visitor.session.flash = note(before)
    return redirect(user_url(user_id, "d", distillation_id))


@router.post("/d/{distillation_id}/tier")
def change_tier(user_id: str, distillation_id: UUID, visitor: SignedIn, services: Services,
                tier: Annotated[Tier, Form()], csrf_token: CsrfToken = "") -> Response:
    """Change a distillation's tier (core, medium, low: how much it weighs in recall), audited."""
    return _changed_distillation(
        user_id, distillation_id, visitor, csrf_token,
        lambda actor: set_tier(services.database, distillation_id, tier=tier, user_id=user_id, actor=actor),
        lambda before: _change_note("tier", before, tier))


@router.post("/d/{distillation_id}/type")
def change_type(user_id: str, distillation_id: UUID, visitor: SignedIn, services: Services,
                memory_type: Annotated[MemoryType, Form()], csrf_token: CsrfToken = "") -> Response:
    """Change a distillation's type (instruction, preference, fact, event: how MEMORY.md groups it;
    an event is dated from its exchange), audited, as ``POST /api/distillations/{id}/type``."""
    return _changed_distillation(
        user_id, distillation_id, visitor, csrf_token,
        lambda actor: set_memory_type(services.database, distillation_id, memory_type=memory_type, user_id=user_id,
                                      actor=actor),
        lambda before: _change_note("type", before.memory_type, memory_type))


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
    keep = None if choice == "dismiss" else choice
    done = close_conflict(services.database, conflict_id, status="dismissed" if keep is None else "resolved",
                          keep=keep, user_id=user_id, actor=visitor.caller.actor)
    if not done:
        raise PageError(404, f"no open conflict {conflict_id}")
    visitor.session.flash = _CONFLICT_NOTES[choice]
    return redirect(user_url(user_id, "conflicts"))


@router.post("/d/{distillation_id}/weight")
def pin(user_id: str, distillation_id: UUID, visitor: SignedIn, services: Services,
        user_weight: Annotated[float, Form(gt=0, le=MAX_USER_WEIGHT)], csrf_token: CsrfToken = "") -> Response:
    """Pin or unpin: set ``user_weight`` (as ``POST /api/distillations/{id}/weight``); the note says
    what it means for recall ("counts twice as much"), not the number's change."""
    return _changed_distillation(
        user_id, distillation_id, visitor, csrf_token,
        lambda actor: set_weight(services.database, distillation_id, user_weight=user_weight, user_id=user_id,
                                 actor=actor),
        lambda before: weight_note(before, user_weight))


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
    visitor.session.flash = (f"forgot memory {memory_id} and "
                             f"{plural(len(outcome.deleted_distillation_ids), 'distillation')} made from it")
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
    visitor.session.flash = f"forgot {plural(len(outcome.deleted_memory_ids), 'memory', 'memories')}"
    return redirect(user_url(user_id, "recent"))
