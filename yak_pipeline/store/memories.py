"""The raw layer: exchanges stored at full fidelity, idempotent on their content hash."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, NamedTuple
from uuid import UUID

import numpy as np
import psycopg
from psycopg.rows import class_row

from yak_pipeline.core.exchanges import content_sha256, normalise_exchange_text
from yak_pipeline.core.secrets import SecretsPolicy, screen_secrets
from yak_pipeline.core.types import MEMORY_SOURCES, validate_user_id
from yak_pipeline.store.profile import write_fresh_profile_lines
from yak_pipeline.store.rows import PendingPartition, claim_pending_rows, list_live_rows, live_row, one_value
from yak_pipeline.store.secret_redactions import record_redaction


class MemoryToDistil(NamedTuple):
    """What distilling a memory reads of it, under its lock (``store.locking.lock_live_row``)."""

    id: UUID
    user_id: str
    content: str
    occurred_at: datetime
    attempts: int
    status: str


_MEMORY_COLUMNS = "id, user_id, content, occurred_at, created_at, source, source_ref, content_sha256, status, attempts, last_error"


@dataclass(frozen=True)
class StoredMemory:
    """The outcome of an insert: the row's id and whether this call created it."""

    id: UUID
    user_id: str
    created: bool
    created_at: datetime
    occurred_at: datetime
    status: str


@dataclass(frozen=True)
class NewExchange:
    """An exchange checked and ready to store: its text normalised and screened for secrets, hashed."""

    user_id: str
    content: str
    occurred_at: datetime
    source: str
    source_ref: str | None
    content_sha256: str
    # The secrets replaced in its text, by kind (none for most exchanges).
    secret_kinds: Mapping[str, int]


def new_exchange(
    *,
    user_id: str,
    content: str,
    source: str,
    occurred_at: datetime | None = None,
    source_ref: str | None = None,
    secrets: SecretsPolicy = "redact",
) -> NewExchange:
    """Check one exchange and make it what storing keeps; ``ValueError`` (one line) when it cannot be stored.

    A secret in its text is replaced by a placeholder (or, with ``secrets="refuse"``,
    ``SecretRefused`` is raised) before it is hashed, stored, embedded or distilled.
    """
    validate_user_id(user_id)
    if source not in MEMORY_SOURCES:
        raise ValueError(f"unknown memory source {source!r}")
    screened = screen_secrets(normalise_exchange_text(content), secrets)
    text = screened.text
    if not text.strip():
        raise ValueError("memory content is empty")
    if occurred_at is not None and occurred_at.tzinfo is None:
        raise ValueError("occurred_at must carry a time zone")
    return NewExchange(user_id, text, occurred_at or datetime.now(UTC), source, source_ref, content_sha256(text),
                       screened.kinds)


def _record_stored(conn: psycopg.Connection, stored: Sequence[tuple[UUID, NewExchange]], actor: str) -> None:
    """What storing new exchanges writes beside them: an audit row each, their redactions, their profile lines."""
    if not stored:
        return
    # One statement for all their audit rows (write_audit's row, each).
    conn.execute(
        """INSERT INTO audit_log (user_id, actor, action, target_type, target_id, detail)
           SELECT user_id, %(actor)s, 'ingest', 'memory', target_id, jsonb_build_object('source', source)
             FROM unnest(%(user_ids)s::text[], %(memory_ids)s::text[], %(sources)s::text[]) AS t(user_id, target_id, source)""",
        {"actor": actor, "user_ids": [new.user_id for _, new in stored],
         "memory_ids": [str(memory_id) for memory_id, _ in stored], "sources": [new.source for _, new in stored]})
    for memory_id, new in stored:
        record_redaction(conn, kinds=new.secret_kinds, actor=actor, user_id=new.user_id, target_type="memory",
                         target_id=memory_id)
    # The user's standing instructions and preferences, in the profile at once (store.profile).
    write_fresh_profile_lines(conn, [(memory_id, new.user_id, new.content) for memory_id, new in stored])


def insert_memory(conn: psycopg.Connection, exchange: NewExchange, *, actor: str = "system") -> StoredMemory:
    """Store one checked exchange (:func:`new_exchange`) as a ``pending`` memory; the same exchange
    twice is stored once.

    Returns the existing row (``created=False``) when the user already has this content. Every
    exchange that enters Yak is checked by :func:`new_exchange` and stored here or by
    :func:`insert_memories`: a secret in its text is replaced by a placeholder (or, with
    ``secrets="refuse"``, the check raises ``SecretRefused``) before it is stored, hashed, embedded
    or distilled; the audit log and ``yak_secrets_redacted_total`` count it. The instructions and
    preferences the user states in it join their profile (``store.profile``).
    """
    return insert_memories(conn, [exchange], actor=actor)[0]


def insert_memories(conn: psycopg.Connection, exchanges: Sequence[NewExchange], *,
                    actor: str = "system") -> list[StoredMemory]:
    """Store many checked exchanges (:func:`new_exchange`) as ``pending`` memories with one INSERT;
    one :class:`StoredMemory` per exchange, in order.

    What :func:`insert_memory` does for each, in a handful of statements for them all: an exchange
    the user already has (stored before, or earlier in ``exchanges``) is not stored again
    (``created=False``, the stored row's id). Rows are inserted in the given order, so exchanges
    sharing a timestamp keep their arrival order (``seq``, sql/006), and the one INSERT gives the
    conversation context of them all and of their neighbours in one step (sql/018). A value the
    database refuses fails the whole call (the caller's transaction): store one by one to tell which.
    """
    if not exchanges:
        return []
    inserted = conn.execute(
        """INSERT INTO memories (user_id, content, occurred_at, source, source_ref, content_sha256)
           SELECT user_id, content, occurred_at, source, source_ref, sha
             FROM unnest(%(user_ids)s::text[], %(contents)s::text[], %(occurred_ats)s::timestamptz[],
                         %(sources)s::text[], %(source_refs)s::text[], %(digests)s::text[])
                  WITH ORDINALITY AS t(user_id, content, occurred_at, source, source_ref, sha, position)
            ORDER BY position
           ON CONFLICT (user_id, content_sha256) DO NOTHING
           RETURNING id, user_id, content_sha256, created_at, occurred_at, status""",
        {"user_ids": [e.user_id for e in exchanges], "contents": [e.content for e in exchanges],
         "occurred_ats": [e.occurred_at for e in exchanges], "sources": [e.source for e in exchanges],
         "source_refs": [e.source_ref for e in exchanges], "digests": [e.content_sha256 for e in exchanges]},
    ).fetchall()
    fresh = {(r[1], r[2]): r for r in inserted}
    # The first of equal exchanges is the one stored; the others, and those stored before, find it.
    first: dict[tuple[str, str], int] = {}
    for position, e in enumerate(exchanges):
        first.setdefault((e.user_id, e.content_sha256), position)
    missing = [key for key in first if key not in fresh]
    found = {}
    if missing:
        found = {(r[1], r[2]): r for r in conn.execute(
            """SELECT m.id, m.user_id, m.content_sha256, m.created_at, m.occurred_at, m.status
                 FROM unnest(%(user_ids)s::text[], %(digests)s::text[]) AS k(user_id, sha)
                 JOIN memories m ON m.user_id = k.user_id AND m.content_sha256 = k.sha""",
            {"user_ids": [k[0] for k in missing], "digests": [k[1] for k in missing]}).fetchall()}
    result = []
    for position, e in enumerate(exchanges):
        key = (e.user_id, e.content_sha256)
        created = key in fresh and first[key] == position
        row = fresh[key] if key in fresh else found[key]
        result.append(StoredMemory(row[0], e.user_id, created, row[3], row[4], row[5]))
    _record_stored(conn, [(stored.id, e) for stored, e in zip(result, exchanges) if stored.created], actor)
    return result


def get_memory(conn: psycopg.Connection, memory_id: UUID | str, *, user_id: str | None = None) -> dict[str, Any] | None:
    """One live memory by id; with ``user_id``, only if it belongs to that user."""
    return live_row(conn, "memories", _MEMORY_COLUMNS, memory_id, user_id=user_id)


def list_memories(
    conn: psycopg.Connection,
    *,
    user_id: str | None = None,
    status: str | None = None,
    limit: int = 50,
    offset: int = 0,
) -> list[dict[str, Any]]:
    """Live memories, newest exchange first, optionally for one user and status."""
    return list_live_rows(conn, "memories", _MEMORY_COLUMNS, where={"user_id": user_id, "status": status},
                          order_by="occurred_at DESC, id", limit=limit, offset=offset)


def user_has_memories(conn: psycopg.Connection, user_id: str) -> bool:
    """Whether ``user_id`` has any live memory: Yak has no user registry, a user is their memories."""
    return one_value(conn, "SELECT EXISTS (SELECT 1 FROM memories WHERE user_id = %(user_id)s AND deleted_at IS NULL)",
                     {"user_id": user_id}, bool)


def days_with_data(conn: psycopg.Connection, *, user_id: str | None = None, since: date | None = None,
                   until: date | None = None) -> list[tuple[str, date]]:
    """Every ``(user_id, UTC day)`` with a live exchange or turn, optionally of one user and within
    ``since`` … ``until`` (inclusive): the days a run of a user's partition covers when not told them."""
    clauses, params = ["deleted_at IS NULL"], {"user_id": user_id, "since": since, "until": until}
    if user_id is not None:
        clauses.append("user_id = %(user_id)s")
    if since is not None:
        clauses.append("occurred_at >= %(since)s::date::timestamp AT TIME ZONE 'UTC'")
    if until is not None:
        clauses.append("occurred_at < (%(until)s::date + 1)::timestamp AT TIME ZONE 'UTC'")
    where = " AND ".join(clauses)
    rows = conn.execute(
        f"""SELECT user_id, (occurred_at AT TIME ZONE 'UTC')::date AS day FROM memories WHERE {where}
            UNION
            SELECT user_id, (occurred_at AT TIME ZONE 'UTC')::date FROM turns WHERE {where}
            ORDER BY 1, 2""",  # noqa: S608 - the clauses are constants; values are parameters
        params,
    ).fetchall()
    return [(row[0], row[1]) for row in rows]


def users_with_data(conn: psycopg.Connection, user_ids: Sequence[str]) -> set[str]:
    """Which of ``user_ids`` still have a live exchange or turn (one index probe each, so a sensor
    can ask every tick: a user without any has been forgotten)."""
    rows = conn.execute(
        """SELECT u FROM unnest(%(user_ids)s::text[]) AS u
           WHERE EXISTS (SELECT 1 FROM memories m WHERE m.user_id = u AND m.deleted_at IS NULL)
              OR EXISTS (SELECT 1 FROM turns t WHERE t.user_id = u AND t.deleted_at IS NULL)""",
        {"user_ids": list(user_ids)},
    ).fetchall()
    return {row[0] for row in rows}


def claim_pending_memories(
    conn: psycopg.Connection,
    *,
    user_id: str | None = None,
    day: date | None = None,
    limit: int = 1000,
) -> list[dict[str, Any]]:
    """Lock and return pending memories (optionally of one user and UTC day).

    ``FOR UPDATE SKIP LOCKED``: concurrent workers never claim the same memory, so no memory
    is distilled twice. The locks hold until the caller's transaction ends.
    """
    return claim_pending_rows(conn, "memories", _MEMORY_COLUMNS, user_id=user_id, day=day, limit=limit)


def pending_memory_partitions(conn: psycopg.Connection, *, drop_folder: bool | None = None) -> list[PendingPartition]:
    """The partitions with memory work left, for the sensors and ``yak process``.

    Work left is a pending memory, or an active distillation whose conflict or near-duplicate
    check never completed (a worker killed mid-partition, an LLM failure in those stages);
    partitions whose quality gate last failed are held back for those checks, as their runs are.
    The signature changes whenever the partition's pending work does (a new memory, a failed
    attempt, a check done), so a run key built from it requests one run per state, never a duplicate.
    It names the pending rows themselves: a creation time (to the second) did not tell a memory
    added just after a run from the one the run had finished.
    """
    with conn.cursor(row_factory=class_row(PendingPartition)) as cur:
        return cur.execute(
        """WITH pending AS (
               SELECT user_id, (occurred_at AT TIME ZONE 'UTC')::date AS day, count(*) AS n,
                      count(*) || '-' || left(md5(string_agg(id::text || ':' || attempts, ',' ORDER BY id)), 16) AS sig
               FROM memories WHERE status = 'pending' AND deleted_at IS NULL
                 AND (%(drop)s::boolean IS NULL OR (source = 'drop_folder') = %(drop)s)
               GROUP BY 1, 2),
           unchecked AS (
               SELECT d.user_id, (m.occurred_at AT TIME ZONE 'UTC')::date AS day, count(*) AS n
               FROM distillations d JOIN memories m ON m.id = d.memory_id
               WHERE d.status = 'active' AND d.deleted_at IS NULL AND m.deleted_at IS NULL
                 AND (d.conflict_checked_at IS NULL OR d.dedup_checked_at IS NULL)
                 AND (%(drop)s::boolean IS NULL OR (m.source = 'drop_folder') = %(drop)s)
                 AND NOT EXISTS (SELECT 1 FROM partition_gates g
                                 WHERE g.user_id = d.user_id AND g.day = (m.occurred_at AT TIME ZONE 'UTC')::date
                                   AND NOT g.passed)
               GROUP BY 1, 2)
           SELECT user_id, day, coalesce(p.n, 0) + coalesce(u.n, 0) AS rows,
                  coalesce(p.sig, '0') || CASE WHEN u.n IS NULL THEN '' ELSE '-unchecked' || u.n END AS signature
           FROM pending p FULL JOIN unchecked u USING (user_id, day)
           ORDER BY 2, 1""",
        {"drop": drop_folder},
        ).fetchall()


def users_of_memories(conn: psycopg.Connection, memory_ids: Sequence[UUID | str]) -> list[str]:
    """The users the given memories belong to, each once, in order."""
    rows = conn.execute("SELECT DISTINCT user_id FROM memories WHERE id = ANY(%(memory_ids)s::uuid[]) ORDER BY user_id",
                        {"memory_ids": [str(i) for i in memory_ids]}).fetchall()
    return [r[0] for r in rows]


def context_to_embed(conn: psycopg.Connection, memory_id: UUID | str, *, embedding_model: str) -> str | None:
    """The exchange read with its neighbours (``yak_exchange_context_text``, sql/008) when its
    context vector is missing or of another model; None when it has a current one."""
    row = conn.execute(
        """SELECT yak_exchange_context_text(id) FROM memories
           WHERE id = %(memory_id)s AND (context_embedding IS NULL OR context_embedding_model IS DISTINCT FROM %(embedding_model)s)""",
        {"memory_id": str(memory_id), "embedding_model": embedding_model},
    ).fetchone()
    return None if row is None else row[0]


def mark_memory_distilled(conn: psycopg.Connection, memory_id: UUID | str, *,
                          embedding: Sequence[float], embedding_model: str,
                          context_embedding: Sequence[float] | None = None) -> None:
    """Mark a memory as distilled, clear its last error and store the exchange's own vector (and,
    given, its context vector: :func:`context_to_embed`'s text, read under the same row lock).

    One UPDATE, not two: ``status`` is indexed, so every UPDATE of a memory writes a new entry
    into each of its indexes (the two HNSW graphs among them) — a second statement for the
    vector doubled that work for every distilled exchange.
    """
    context = None if context_embedding is None else np.asarray(context_embedding, dtype=np.float32)
    conn.execute(
        """UPDATE memories SET status = 'distilled', last_error = NULL, attempts = attempts + 1,
                  embedding = %(vector)s, embedding_model = %(model)s,
                  context_embedding = CASE WHEN %(has_context)s THEN %(context)s ELSE context_embedding END,
                  context_embedding_model = CASE WHEN %(has_context)s THEN %(model)s
                                                 ELSE context_embedding_model END
           WHERE id = %(id)s""",
        {"vector": np.asarray(embedding, dtype=np.float32), "model": embedding_model, "context": context,
         "has_context": context is not None, "id": str(memory_id)},
    )


def record_memory_error(conn: psycopg.Connection, memory_id: UUID | str, error: str, *, give_up: bool = False) -> None:
    """Record why distilling a memory failed; it stays ``pending`` (retried) unless ``give_up``."""
    conn.execute(
        """UPDATE memories SET last_error = %(error)s, attempts = attempts + 1,
                  status = CASE WHEN %(give_up)s THEN 'failed' ELSE status END
           WHERE id = %(memory_id)s""",
        {"error": error[:2000], "give_up": give_up, "memory_id": str(memory_id)},
    )


def reset_memories_to_pending(conn: psycopg.Connection, memory_ids: list[UUID | str]) -> int:
    """Send memories back to the distillation queue (re-distillation, retry of failed ones)."""
    cur = conn.execute(
        "UPDATE memories SET status = 'pending', last_error = NULL WHERE id = ANY(%(memory_ids)s::uuid[]) AND deleted_at IS NULL",
        {"memory_ids": [str(i) for i in memory_ids]},
    )
    return cur.rowcount


def rebuild_exchange_context(conn: psycopg.Connection, *, user_id: str | None = None) -> int:
    """Recompute every live exchange's conversation context (sql/006), of one user or all; rows done.

    The trigger keeps contexts right write by write; this is the repair for rows written with
    the trigger disabled (a bulk load) or by an older version.
    """
    return one_value(conn, "SELECT yak_rebuild_exchange_context(%(user_id)s)", {"user_id": user_id}, int)


def partition_memory_stats(conn: psycopg.Connection, *, user_id: str, day: date) -> dict[str, Any]:
    """Counts of a user's day of exchanges by status and source, and rows whose hash does not match."""
    rows = conn.execute(
        """SELECT status, source, count(*) FROM memories
           WHERE user_id = %(user_id)s AND deleted_at IS NULL AND (occurred_at AT TIME ZONE 'UTC')::date = %(day)s
           GROUP BY 1, 2""",
        {"user_id": user_id, "day": day},
    ).fetchall()
    stats: dict[str, Any] = {"rows": 0, "pending": 0, "distilled": 0, "failed": 0}
    for status, source, count in rows:
        stats["rows"] += count
        stats[status] += count
        stats[f"source_{source}"] = stats.get(f"source_{source}", 0) + count
    # Integrity: the stored hash must still be the hash of the stored text.
    contents = conn.execute(
        """SELECT content, content_sha256 FROM memories
           WHERE user_id = %(user_id)s AND deleted_at IS NULL AND (occurred_at AT TIME ZONE 'UTC')::date = %(day)s""",
        {"user_id": user_id, "day": day},
    ).fetchall()
    stats["hash_mismatches"] = sum(1 for content, digest in contents if content_sha256(content) != digest)
    return stats


def memories_to_distill(conn: psycopg.Connection, *, user_id: str, day: date | None, include_outdated: bool,
                        prompt_version: str, schema_version: int) -> list[str]:
    """Ids of a partition's memories that need (re-)distilling, oldest first.

    Pending memories always; with ``include_outdated`` also distilled memories whose live
    distillation was made by another prompt or output-schema version.
    """
    rows = conn.execute(
        """SELECT m.id FROM memories m
           WHERE m.user_id = %(user)s AND m.deleted_at IS NULL
             AND (%(day)s::date IS NULL OR (m.occurred_at AT TIME ZONE 'UTC')::date = %(day)s)
             AND (m.status = 'pending' OR (%(outdated)s AND EXISTS (
                    SELECT 1 FROM distillations d WHERE d.memory_id = m.id AND d.deleted_at IS NULL
                      AND d.status IN ('active', 'review')
                      AND (d.prompt_version <> %(prompt)s OR d.schema_version <> %(schema)s))))
           ORDER BY m.occurred_at, m.id""",
        {"user": user_id, "day": day, "outdated": include_outdated, "prompt": prompt_version,
         "schema": schema_version},
    ).fetchall()
    return [str(r[0]) for r in rows]

