"""Exchanges that grew since they were stored (issue 34): updated in place, never stored twice.

A Claude Code session is imported while it is still open: its last exchange may be unfinished (the
answer still being written), and the next import of the grown file reads it again, finished. The
exchange keeps its place in the source (``source_ref`` ends ``#claude-code:<session>:<prompt uuid>``),
so the stored memory is found by that ref and its content replaced: back to ``pending`` (the
pipeline re-distils it, the old distillation's text kept as a version) and without vectors (the
next embedding pass gives it new ones). The text it had is kept in the audit row: nothing is lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

import psycopg

from yak_pipeline.core.exchanges import content_sha256, normalise_exchange_text
from yak_pipeline.core.secrets import SecretsPolicy, screen_secrets
from yak_pipeline.store.audit import write_audit
from yak_pipeline.store.profile import write_profile_lines
from yak_pipeline.store.secret_redactions import record_redaction


@dataclass(frozen=True)
class StoredByRef:
    """The memory an exchange's source ref already has: its id, content hash, and whether it was forgotten."""

    id: UUID
    content_sha256: str
    forgotten: bool


def memories_by_ref(conn: psycopg.Connection, user_id: str, refs: Sequence[str]) -> dict[str, StoredByRef]:
    """The user's memories (forgotten ones too) whose ``source_ref`` ends in ``#<ref>`` or is ``<ref>``, by ref."""
    if not refs:
        return {}
    rows = conn.execute(
        """SELECT split_part(source_ref, '#', -1), id, content_sha256, deleted_at IS NOT NULL
             FROM memories WHERE user_id = %(user_id)s AND split_part(source_ref, '#', -1) = ANY(%(refs)s)
            ORDER BY created_at""",
        {"user_id": user_id, "refs": list(refs)},
    ).fetchall()
    return {ref: StoredByRef(memory_id, digest, forgotten) for ref, memory_id, digest, forgotten in rows}


def grow_exchange(conn: psycopg.Connection, memory_id: UUID, *, user_id: str, content: str,
                  actor: str = "system", secrets: SecretsPolicy = "redact") -> bool:
    """Replace a live memory's exchange with its grown text (module docstring); False when another memory
    of the user already holds that text (nothing changed) or the memory is gone. The grown text's
    secrets are screened as ``store.memories.new_exchange`` screens every new exchange's."""
    screened = screen_secrets(normalise_exchange_text(content), secrets)
    text = screened.text
    digest = content_sha256(text)
    before = conn.execute("SELECT content FROM memories WHERE id = %(memory_id)s AND user_id = %(user_id)s AND deleted_at IS NULL",
                          {"memory_id": memory_id, "user_id": user_id}).fetchone()
    if before is None:
        return False
    taken = conn.execute("SELECT 1 FROM memories WHERE user_id = %(user_id)s AND content_sha256 = %(digest)s AND id <> %(memory_id)s",
                         {"user_id": user_id, "digest": digest, "memory_id": memory_id}).fetchone()
    if taken is not None:
        return False
    conn.execute(
        """UPDATE memories SET content = %(text)s, content_sha256 = %(digest)s, status = 'pending', attempts = 0,
                  last_error = NULL, embedding = NULL, embedding_model = NULL,
                  context_embedding = NULL, context_embedding_model = NULL
            WHERE id = %(memory_id)s""",
        {"text": text, "digest": digest, "memory_id": memory_id},
    )
    write_audit(conn, actor=actor, action="grow", target_type="memory", target_id=memory_id, user_id=user_id,
                detail={"previous_content": before[0], "previous_sha256": content_sha256(before[0])})
    record_redaction(conn, kinds=screened.kinds, actor=actor, user_id=user_id, target_type="memory",
                     target_id=memory_id)
    write_profile_lines(conn, memory_id=memory_id, user_id=user_id, content=text)
    return True
