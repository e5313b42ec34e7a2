"""Who is calling: an ``X-API-Key`` that is an admin key or scoped to one user id.

Keys are compared as SHA-256 digests with :func:`hmac.compare_digest`, so neither the key's
content nor its length shows in the time a check takes. A user-scoped key only ever reaches
its own user's rows: routes pass :attr:`Principal.scope` to the store, which then finds no
row for another user's id, and the route answers 404, exactly as for an id that never existed.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import HTTPException, status

from yak_pipeline.services.api_keys import find_key

READ_ONLY_DETAIL = "this API key is read-only: it can recall and search, not write or forget"
# What a read-only key may ask by POST: the reads whose question is a body (everything else it
# may do is a GET). A route added later is a write for it until it is listed here.
READ_ONLY_POSTS = frozenset({"/api/distillations/search", "/api/context"})

if TYPE_CHECKING:
    from yak_pipeline.api.dependencies import ApiServices


@dataclass(frozen=True)
class Principal:
    """The caller: ``user_id`` None means admin. ``actor`` names the key in the audit log;
    ``read_only`` keys recall and search, and nothing else (:meth:`require_write`)."""

    user_id: str | None
    actor: str
    read_only: bool = False

    @property
    def is_admin(self) -> bool:
        """Admin keys act for every user."""
        return self.user_id is None

    @property
    def scope(self) -> str | None:
        """The user id store queries must be limited to (None: no limit, for admins)."""
        return self.user_id

    def acting_for(self, user_id: str) -> str:
        """``user_id`` if this caller may act for that user, else 403 (which says nothing about the user)."""
        if self.user_id is not None and user_id != self.user_id:
            raise HTTPException(status.HTTP_403_FORBIDDEN, "this API key is scoped to another user")
        return user_id

    def user_filter(self, requested: str | None) -> str | None:
        """The user a listing is limited to: the requested one (checked), or the key's own user."""
        if requested is not None:
            return self.acting_for(requested)
        return self.user_id

    def require_write(self) -> None:
        """403 for a read-only key: it may recall and search, never write or forget."""
        if self.read_only:
            raise HTTPException(status.HTTP_403_FORBIDDEN, READ_ONLY_DETAIL)

    def require_admin(self) -> None:
        """403 unless this is an admin key."""
        if self.user_id is not None:
            raise HTTPException(status.HTTP_403_FORBIDDEN, "this route needs an admin API key")


def key_from_headers(api_key: str | None, authorization: str | None) -> str | None:
    """The key of a request: ``X-API-Key``, else an ``Authorization: Bearer`` token (what OpenAI clients send)."""
    if api_key:
        return api_key
    if authorization:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return None


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def authenticate(services: ApiServices, key: str | None) -> Principal:
    """The principal for ``key``: a configured admin key, else a stored live key; 401 otherwise."""
    if not key:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing X-API-Key header",
                            headers={"WWW-Authenticate": "ApiKey"})
    given = _digest(key)
    # Every configured key is compared, matched or not, so timing does not tell which matched.
    matched = False
    for admin_key in services.admin_keys:
        matched |= hmac.compare_digest(given, _digest(admin_key))
    if matched:
        return Principal(user_id=None, actor="api:admin")
    record = find_key(services.database, key)
    if record is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "invalid or revoked API key",
                            headers={"WWW-Authenticate": "ApiKey"})
    return Principal(user_id=record.user_id, actor=f"api:key:{record.prefix}", read_only=record.read_only)
