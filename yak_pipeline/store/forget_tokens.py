"""Confirmation tokens for a forget by phrase: single-use, short-lived, bound to a user and ids.

The token is random and only its hash is stored, so it cannot be forged or read back; it names
the exact memories that were shown as candidates, so confirming deletes those and nothing else.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final, NamedTuple
from uuid import UUID

import psycopg
from psycopg.rows import class_row

from yak_pipeline.store.rows import one_value

DEFAULT_TTL: Final = timedelta(minutes=10)


@dataclass(frozen=True)
class ForgetToken:
    """A freshly issued token (shown once) and when it stops working."""

    token: str
    expires_at: datetime


class RedeemedToken(NamedTuple):
    """A used-up token: whose memories it confirmed forgetting, and which."""

    user_id: str
    memory_ids: list[str]  # as text, as the forget that follows takes them


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def issue_forget_token(
    conn: psycopg.Connection, *, user_id: str, memory_ids: Sequence[UUID | str], ttl: timedelta = DEFAULT_TTL
) -> ForgetToken:
    """Store a token that confirms forgetting exactly ``memory_ids`` of ``user_id``; expired ones are purged."""
    if not memory_ids:
        raise ValueError("a forget confirmation needs at least one memory id")
    conn.execute("DELETE FROM forget_confirmations WHERE expires_at <= now()")
    token = secrets.token_urlsafe(32)
    expires_at = one_value(
        conn,
        """INSERT INTO forget_confirmations (token_hash, user_id, memory_ids, expires_at)
           VALUES (%(token_hash)s, %(user_id)s, %(memory_ids)s::uuid[], now() + %(ttl)s) RETURNING expires_at""",
        {"token_hash": _hash(token), "user_id": user_id, "memory_ids": sorted({str(m) for m in memory_ids}),
         "ttl": ttl},
        datetime,
    )
    return ForgetToken(token, expires_at)


def redeem_forget_token(conn: psycopg.Connection, token: str, *, user_id: str | None) -> RedeemedToken | None:
    """Use up a live token; None when it is unknown, expired, already used or (with ``user_id``)
    another user's."""
    with conn.cursor(row_factory=class_row(RedeemedToken)) as cur:
        return cur.execute(
            """DELETE FROM forget_confirmations
               WHERE token_hash = %(hash)s AND expires_at > now() AND (%(user)s::text IS NULL OR user_id = %(user)s)
               RETURNING user_id, memory_ids::text[] AS memory_ids""",
            {"hash": _hash(token), "user": user_id},
        ).fetchone()
