"""The web page's sign-in sessions: kept in the server's memory, for one browser session only.

The browser holds a random session id in a cookie without an expiry (gone when the browser
closes), ``HttpOnly`` and ``SameSite=Strict``; the API key it signed in with stays on the server,
never in the cookie, and is checked again on every request, so revoking a key ends its sessions.
A restart of the server ends every session (people sign in again). Each session carries a CSRF
token that every state-changing form must send back (the synchronizer-token pattern); the
sign-in form has one too, from the anonymous session a first visit opens, so no other site can
sign a browser in with its own key.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final

COOKIE_NAME: Final = "yak_session"
# A session unused this long is forgotten (the browser's cookie then signs in again).
IDLE_SECONDS: Final = 8 * 3600
# Bounds the memory anonymous visits can take; the least recently used session goes first.
MAX_SESSIONS: Final = 2_000


@dataclass
class PageSession:
    """One browser's session: its CSRF token and, once signed in, the API key it signed in with."""

    id: str
    csrf_token: str
    api_key: str | None = None
    # One line shown on the next page (what an action did), then cleared.
    flash: str | None = None
    last_used: float = field(default_factory=time.monotonic)

    def csrf_matches(self, token: str | None) -> bool:
        """Whether a form sent this session's CSRF token (compared in constant time)."""
        if not token:
            return False
        return secrets.compare_digest(token.encode(), self.csrf_token.encode())


def _new_session(api_key: str | None = None) -> PageSession:
    return PageSession(id=secrets.token_urlsafe(32), csrf_token=secrets.token_urlsafe(32), api_key=api_key)


class SessionStore:
    """Sessions by id, thread-safe (page routes run in the thread pool)."""

    def __init__(self, *, idle_seconds: float = IDLE_SECONDS, max_sessions: int = MAX_SESSIONS) -> None:
        self._sessions: OrderedDict[str, PageSession] = OrderedDict()
        self._lock = threading.Lock()
        self._idle_seconds = idle_seconds
        self._max_sessions = max_sessions

    def get(self, session_id: str | None) -> PageSession | None:
        """The live session with this id, marked as used now; None when unknown or idle too long."""
        if not session_id:
            return None
        now = time.monotonic()
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                return None
            if now - session.last_used > self._idle_seconds:
                del self._sessions[session_id]
                return None
            session.last_used = now
            self._sessions.move_to_end(session_id)
            return session

    def _add(self, session: PageSession) -> PageSession:
        with self._lock:
            self._sessions[session.id] = session
            while len(self._sessions) > self._max_sessions:
                self._sessions.popitem(last=False)
        return session

    def anonymous(self) -> PageSession:
        """A new session that is not signed in (it carries the sign-in form's CSRF token)."""
        return self._add(_new_session())

    def sign_in(self, previous: PageSession | None, api_key: str) -> PageSession:
        """A new signed-in session; the previous one (anonymous) is dropped, so an id planted in a
        browser before sign-in is worth nothing after it."""
        if previous is not None:
            self.drop(previous.id)
        return self._add(_new_session(api_key))

    def drop(self, session_id: str) -> None:
        """Forget a session (sign-out, or a key that no longer works)."""
        with self._lock:
            self._sessions.pop(session_id, None)
