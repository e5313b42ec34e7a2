"""Who is looking at the page, what they may see, and how pages answer.

Every page and action finds its caller the way the API does (:func:`~yak_pipeline.api.auth.authenticate`
on the key the session signed in with), so scoping is the API's: a user-scoped key reaches only
its own user's pages (403 for another user's, 404 for another user's ids). The audit log names
page actions ``web:admin`` / ``web:key:<prefix>``, as the proxy's are ``proxy:…``.

Pages answer HTML, also when something goes wrong: :class:`PageRoute` turns a bad form, an id
that is not the caller's, or a database that is down into an error page with one line saying
what to do (the 503 still counts the error and raises the alert, as the API's does). Every page
is sent with a Content-Security-Policy that allows no script at all: memory text is escaped by
the templates, and the policy is the second lock on that door.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final

import jinja2
from fastapi import Depends, Form, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates
from starlette.concurrency import run_in_threadpool
from starlette.responses import RedirectResponse

from yak_pipeline.api.auth import READ_ONLY_DETAIL, Principal, authenticate
from yak_pipeline.api.dependencies import Services
from yak_pipeline.api.errors import database_unavailable_response, one_line
from yak_pipeline.api.ui.sessions import COOKIE_NAME, PageSession, SessionStore
from yak_pipeline.core.types import USER_ID_PATTERN
from yak_pipeline.core.wording import plural
from yak_pipeline.recall_models import RelevanceModelMissing
from yak_pipeline.store.errors import DatabaseUnavailable

PREFIX: Final = "/ui"
_USER_ID_RE: Final = re.compile(USER_ID_PATTERN)

SECURITY_HEADERS: Final = {
    # No script, no plugin, no framing, forms only to this site: the page needs none of it.
    "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                               "base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Memories are private: never kept by a shared cache or the browser's disk cache.
    "Cache-Control": "no-store",
}

templates = Jinja2Templates(env=jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=True,  # every template, whatever its name: memory text is user content
    undefined=jinja2.StrictUndefined,
))


class PageError(Exception):
    """An error page: a status and one line saying what went wrong or what to do."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message


class SignInRequired(Exception):
    """No signed-in session (or its key stopped working): go to the sign-in page."""


@dataclass(frozen=True)
class Visitor:
    """A signed-in browser: its session (CSRF token, flash message) and the caller its key makes it."""

    session: PageSession
    caller: Principal

    def may_see(self, user_id: str) -> bool:
        """Admins see every user; a user-scoped key only its own."""
        return self.caller.is_admin or self.caller.user_id == user_id


def session_store(request: Request) -> SessionStore:
    """The app's page sessions (made by :func:`yak_pipeline.api.ui.install_web_page`)."""
    return request.app.state.page_sessions


def current_session(request: Request) -> PageSession | None:
    """The browser's session, if its cookie names a live one."""
    return session_store(request).get(request.cookies.get(COOKIE_NAME))


def signed_in(request: Request, services: Services) -> Visitor:
    """The signed-in visitor; :class:`SignInRequired` otherwise. The key is checked again on every
    request, so a revoked key (or a new database) ends the session at once."""
    session = current_session(request)
    if session is None or session.api_key is None:
        raise SignInRequired
    try:
        principal = authenticate(services, session.api_key)
    except HTTPException:
        session_store(request).drop(session.id)
        raise SignInRequired from None
    # A read-only key's session may read every page of its user and sign out; no other form.
    if principal.read_only and request.method == "POST" and not request.url.path.endswith("/logout"):
        raise PageError(403, READ_ONLY_DETAIL)
    return Visitor(session, Principal(user_id=principal.user_id, actor="web:" + principal.actor.removeprefix("api:"),
                                      read_only=principal.read_only))


SignedIn = Annotated[Visitor, Depends(signed_in)]


def user_page(visitor: Visitor, user_id: str) -> str:
    """``user_id`` when the visitor may see that user's pages; a 404 page for an invalid id, 403
    for another user's (the API's answers)."""
    if not _USER_ID_RE.fullmatch(user_id):
        raise PageError(404, f"{user_id!r} is not a user id")
    if not visitor.may_see(user_id):
        raise PageError(403, "this API key is scoped to another user")
    return user_id


def checked_form(visitor: Visitor, csrf_token: str) -> None:
    """Refuse a state-changing form that did not come from one of this session's pages."""
    if not visitor.session.csrf_matches(csrf_token):
        raise PageError(403, "this form is out of date or came from another site; reload the page and try again")


CsrfToken = Annotated[str, Form()]


def user_url(user_id: str, *parts: object) -> str:
    """The page path of ``user_id`` (and a sub-page): ``/ui/u/alice/d/<id>``."""
    return "/".join((f"{PREFIX}/u/{user_id}", *(str(p) for p in parts))).rstrip("/")


# What every template (and the macros, imported without context) may use.
templates.env.globals.update(prefix=PREFIX, user_url=user_url, plural=plural)


def redirect(url: str) -> RedirectResponse:
    """See-other: after a form, the browser loads the page with GET (reloading repeats nothing)."""
    return RedirectResponse(url, status_code=303)


def render(request: Request, name: str, *, visitor: Visitor | None = None, status_code: int = 200,
           **context: Any) -> Response:
    """A template with what every page shows: the caller, the CSRF token, the flash message."""
    flash = None
    if visitor is not None:
        flash, visitor.session.flash = visitor.session.flash, None
    return templates.TemplateResponse(request, name, {"visitor": visitor, "flash": flash, **context},
                                      status_code=status_code)


def error_page(request: Request, status_code: int, message: str) -> Response:
    """An error as a page (signed in or not), with the headers every page has."""
    session = current_session(request)
    signed = session is not None and session.api_key is not None
    response = templates.TemplateResponse(request, "error.html", {"status_code": status_code, "message": message, "visitor": None, "flash": None,
                                                                 "signed_in": signed},
                                          status_code=status_code)
    response.headers.update(SECURITY_HEADERS)
    return response


class PageRoute(APIRoute):
    """A page route: answers HTML on errors too, and sends the security headers with every page."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """The route's handler, wrapped to turn the errors a person can meet into error pages."""
        handler = super().get_route_handler()

        async def page_handler(request: Request) -> Response:
            try:
                response = await handler(request)
            except SignInRequired:
                return redirect(f"{PREFIX}/login")
            except PageError as exc:
                return error_page(request, exc.status_code, exc.message)
            except RequestValidationError as exc:
                first = (exc.errors() or [{}])[0]
                field = ".".join(str(p) for p in first.get("loc", ())[1:]) or "form"
                return error_page(request, 422, f"{field}: {one_line(first.get('msg', 'invalid'))}")
            except DatabaseUnavailable as exc:
                # Counted and alerted exactly as the API's 503 (run off the event loop: a webhook may wait).
                await run_in_threadpool(database_unavailable_response, request.app, exc)
                return error_page(request, 503, "the database is unavailable; try again shortly")
            except RelevanceModelMissing as exc:
                return error_page(request, 503, one_line(exc))
            response.headers.update(SECURITY_HEADERS)
            return response

        return page_handler
