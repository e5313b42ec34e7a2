"""API keys as the shells see them: create, list, revoke, and the key behind a request.

One transaction per call; the keys themselves live in ``store/api_keys.py`` (only their hashes
are stored).
"""

from __future__ import annotations

from typing import Literal
from uuid import UUID

from yak_pipeline.store import api_keys as keys_store
from yak_pipeline.store.api_keys import ApiKey
from yak_pipeline.store.database import Database

__all__ = ["ApiKey", "create_key", "find_key", "first_admin_key", "list_keys", "revoke_key"]


def create_key(db: Database, *, user_id: str | None, label: str | None, actor: str,
               read_only: bool = False) -> tuple[ApiKey, str]:
    """A new key (admin when ``user_id`` is None; ``read_only``: recall and search only): its record and
    its text, which is never shown again."""
    with db.connection() as conn:
        return keys_store.create_api_key(conn, user_id=user_id, label=label, actor=actor, read_only=read_only)


def list_keys(db: Database, *, include_revoked: bool = False) -> list[ApiKey]:
    """Stored keys, newest first."""
    with db.connection() as conn:
        return keys_store.list_api_keys(conn, include_revoked=include_revoked)


def revoke_key(db: Database, key_id: UUID | str, *, actor: str) -> ApiKey | None:
    """Revoke a live key and return it; None when there is no live key ``key_id``."""
    with db.connection() as conn:
        if not keys_store.revoke_api_key(conn, key_id, actor=actor):
            return None
        return next(k for k in keys_store.list_api_keys(conn, include_revoked=True) if str(k.id) == str(key_id))


def find_key(db: Database, key: str) -> ApiKey | None:
    """The live stored key matching ``key``, or None."""
    with db.connection() as conn:
        return keys_store.find_api_key(conn, key)


def first_admin_key(db: Database, file_key: str | None, *, label: str,
                    actor: str) -> tuple[Literal["file_works", "keys_exist", "created"], str | None]:
    """What a first start needs, in one transaction: ``(outcome, new key text)``.

    ``file_works`` when ``file_key`` (the key kept in a file, if any) is a live admin key;
    ``keys_exist`` when there is no such file and admin keys exist already (someone set keys
    up); otherwise a new admin key is ``created`` and its text returned.
    """
    with db.connection() as conn:
        if file_key is not None:
            stored = keys_store.find_api_key(conn, file_key)
            if stored is not None and stored.is_admin:
                return "file_works", None
        elif keys_store.has_admin_key(conn):
            return "keys_exist", None
        _, key = keys_store.create_api_key(conn, user_id=None, label=label, actor=actor)
    return "created", key
