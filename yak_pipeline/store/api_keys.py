"""API keys: stored as SHA-256 hashes, each an admin key or scoped to one user id.

A key is shown once, when created. Keys carry 256 random bits, so an unsalted SHA-256 is as
good as a slow hash here: nothing about a key can be guessed from its hash.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Final
from uuid import UUID

import psycopg
from psycopg.rows import class_row, scalar_row

from yak_pipeline.core.types import validate_user_id
from yak_pipeline.store.audit import write_audit

KEY_PREFIX: Final = "yak_"
_DISPLAY_CHARS: Final = 10


@dataclass(frozen=True)
class ApiKey:
    """A stored key (never the key itself)."""

    id: UUID
    key_hash: str
    prefix: str
    user_id: str | None
    label: str | None
    created_at: datetime
    revoked_at: datetime | None
    # Recall and search only: no write, no forget (issue 35).
    read_only: bool = False

    @property
    def is_admin(self) -> bool:
        """Admin keys act for every user."""
        return self.user_id is None


# The columns a key's row is read from: ApiKey's fields, in order (class_row builds it from them by name),
# so the statements and the row type cannot drift apart.
_COLUMNS: Final = ", ".join(column.name for column in fields(ApiKey))


def hash_api_key(key: str) -> str:
    """Hex SHA-256 of a key, the form keys are stored and looked up in."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_api_key_text() -> str:
    """A fresh random key: ``yak_`` and 43 URL-safe characters (256 bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def create_api_key(
    conn: psycopg.Connection, *, user_id: str | None, label: str | None = None, actor: str = "system",
    read_only: bool = False,
) -> tuple[ApiKey, str]:
    """Store a new key (admin when ``user_id`` is None; ``read_only``: it may recall and search, never
    write or forget); returns the record and the key, shown once."""
    if user_id is not None:
        validate_user_id(user_id)
    text = new_api_key_text()
    with conn.cursor(row_factory=class_row(ApiKey)) as cur:
        record = cur.execute(
            f"INSERT INTO api_keys (key_hash, prefix, user_id, label, read_only)"
            f" VALUES (%(key_hash)s, %(prefix)s, %(user_id)s, %(label)s, %(read_only)s) RETURNING {_COLUMNS}",
            {"key_hash": hash_api_key(text), "prefix": text[:_DISPLAY_CHARS], "user_id": user_id, "label": label,
             "read_only": read_only},
        ).fetchone()
    assert record is not None, "INSERT ... RETURNING returns its row"
    write_audit(conn, actor=actor, action="key_create", target_type="api_key", target_id=record.id,
                user_id=user_id, detail={"admin": record.is_admin, "prefix": record.prefix, "read_only": read_only})
    return record, text


def find_api_key(conn: psycopg.Connection, key: str) -> ApiKey | None:
    """The live (unrevoked) key matching ``key``, or None."""
    digest = hash_api_key(key)
    with conn.cursor(row_factory=class_row(ApiKey)) as cur:
        record = cur.execute(
            f"SELECT {_COLUMNS} FROM api_keys WHERE key_hash = %(digest)s AND revoked_at IS NULL", {"digest": digest}
        ).fetchone()
    # The index lookup already matched; comparing again in constant time costs nothing and keeps
    # the check independent of how the database compares text.
    if record is None or not hmac.compare_digest(record.key_hash, digest):
        return None
    return record


def list_api_keys(conn: psycopg.Connection, *, include_revoked: bool = False) -> list[ApiKey]:
    """Every key, newest first (revoked ones only when asked)."""
    with conn.cursor(row_factory=class_row(ApiKey)) as cur:
        return cur.execute(
            f"""SELECT {_COLUMNS} FROM api_keys WHERE (%(include_revoked)s OR revoked_at IS NULL)
                ORDER BY created_at DESC, id""",
            {"include_revoked": include_revoked},
        ).fetchall()


def revoke_api_key(conn: psycopg.Connection, key_id: UUID | str, *, actor: str = "system") -> bool:
    """Revoke a key; False when no live key has that id."""
    with conn.cursor(row_factory=scalar_row) as cur:
        revoked = cur.execute(
            "UPDATE api_keys SET revoked_at = now() WHERE id = %(key_id)s AND revoked_at IS NULL RETURNING user_id",
            {"key_id": str(key_id)},
        ).fetchone()
        # An admin key's user is NULL: whether a row came back, not its value, says it was revoked.
        if cur.rowcount == 0:
            return False
    write_audit(conn, actor=actor, action="key_revoke", target_type="api_key", target_id=key_id, user_id=revoked)
    return True


def has_admin_key(conn: psycopg.Connection) -> bool:
    """Whether any live admin key is stored."""
    with conn.cursor(row_factory=scalar_row) as cur:
        return bool(cur.execute(
            "SELECT EXISTS (SELECT 1 FROM api_keys WHERE user_id IS NULL AND revoked_at IS NULL)"
        ).fetchone())
