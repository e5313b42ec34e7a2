"""Signing in and out of the page, and the admin's list of users to pick from."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, HTTPException, Request, Response

from yak_pipeline.api.auth import authenticate
from yak_pipeline.api.dependencies import Services
from yak_pipeline.api.ui.access import (
    PREFIX,
    CsrfToken,
    PageRoute,
    SignedIn,
    checked_form,
    current_session,
    redirect,
    render,
    session_store,
    user_page,
    user_url,
)
from yak_pipeline.api.ui.sessions import COOKIE_NAME, PageSession
from yak_pipeline.services.overview import users_overview

router = APIRouter(prefix=PREFIX, include_in_schema=False, route_class=PageRoute)


def _set_cookie(request: Request, response: Response, session: PageSession) -> None:
    # No max_age: the cookie lasts as long as the browser session. Secure when served over HTTPS.
    response.set_cookie(COOKIE_NAME, session.id, httponly=True, samesite="strict", path=PREFIX,
                        secure=request.url.scheme == "https")


def _home(user_id: str | None) -> str:
    return f"{PREFIX}/users" if user_id is None else user_url(user_id)


@router.get("")
def index(request: Request, services: Services) -> Response:
    """Where the page starts: the caller's home when signed in, else the sign-in form."""
    session = current_session(request)
    if session is None or session.api_key is None:
        return redirect(f"{PREFIX}/login")
    try:
        return redirect(_home(authenticate(services, session.api_key).user_id))
    except HTTPException:
        session_store(request).drop(session.id)
        return redirect(f"{PREFIX}/login")


router.add_api_route("/", index, methods=["GET"], include_in_schema=False)


def _login_form(request: Request, session: PageSession, *, error: str | None = None, status_code: int = 200) -> Response:
    response = render(request, "login.html", csrf=session.csrf_token, error=error, status_code=status_code)
    _set_cookie(request, response, session)
    return response


@router.get("/login")
def login_form(request: Request) -> Response:
    """The sign-in form: an API key, admin or user-scoped, kept for this browser session only."""
    session = current_session(request) or session_store(request).anonymous()
    return _login_form(request, session)


@router.post("/login")
def login(request: Request, services: Services, api_key: Annotated[str, Form(max_length=512)] = "",
          csrf_token: CsrfToken = "") -> Response:
    """Check the key as the API does; on success a new session (cookie) for this browser."""
    session = current_session(request)
    if session is None or not session.csrf_matches(csrf_token):
        # The anonymous session expired, or the form came from elsewhere: a fresh form.
        return _login_form(request, session_store(request).anonymous(),
                           error="the sign-in form expired; try again", status_code=403)
    try:
        principal = authenticate(services, api_key.strip() or None)
    except HTTPException as exc:
        return _login_form(request, session, error=str(exc.detail), status_code=exc.status_code)
    signed = session_store(request).sign_in(session, api_key.strip())
    response = redirect(_home(principal.user_id))
    _set_cookie(request, response, signed)
    return response


@router.post("/logout")
def logout(request: Request, visitor: SignedIn, csrf_token: CsrfToken = "") -> Response:
    """Sign out: the session is forgotten on the server, the cookie cleared."""
    checked_form(visitor, csrf_token)
    session_store(request).drop(visitor.session.id)
    response = redirect(f"{PREFIX}/login")
    response.delete_cookie(COOKIE_NAME, path=PREFIX)
    return response


@router.get("/users")
def users(request: Request, visitor: SignedIn, services: Services, user: str | None = None) -> Response:
    """Admins pick a user (the users with memories, or any id typed in) and see the whole
    pipeline's queue; a user key goes to its own page."""
    if not visitor.caller.is_admin:
        return redirect(user_url(visitor.caller.user_id or ""))
    if user:
        return redirect(user_url(user_page(visitor, user.strip())))
    rows, queue = users_overview(services.database, services.alerter)
    return render(request, "users.html", visitor=visitor, users=rows, queue=queue)
