"""Distillations and their versions: every content change writes a version, nothing is lost."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, NamedTuple
from uuid import UUID

import numpy as np
import psycopg
from psycopg import sql
from psycopg.rows import class_row, dict_row

from yak_pipeline.core.dedup import Neighbour
from yak_pipeline.core.gates import confidence_gate
from yak_pipeline.core.types import MEMORY_TYPES, TIERS
from yak_pipeline.store.audit import write_audit
from yak_pipeline.store.rows import list_live_rows, live_row, one_value

# The schema's CHECK on user_weight: (0, 10]. 1 is neutral; a pinned memory weighs more.
MAX_USER_WEIGHT = 10.0

_COLUMNS = (
    "id, memory_id, user_id, content, confidence, tier, warmth, user_weight, status, needs_review, "
    "embedding_model, prompt_version, schema_version, refreshed_at, created_at, updated_at, memory_type, event_on, "
    # The live newer distillation that replaced this one; a forgotten one does not count (as
    # knowledge.ACTIVE_MEMORY_SQL and recall treat it).
    "(SELECT s.id FROM distillations s WHERE s.id = distillations.superseded_by AND s.deleted_at IS NULL) "
    "AS superseded_by"
)


@dataclass(frozen=True)
class NewDistillation:
    """What a distillation run produced for one memory, before it is stored."""

    memory_id: UUID | str
    user_id: str
    content: str
    confidence: float
    tier: str
    embedding: Sequence[float]
    embedding_model: str
    prompt_version: str
    refreshed_at: datetime
    schema_version: int = 1
    # What kind of thing it says (core.memory_types), and an event's day.
    memory_type: str = "fact"
    event_on: date | None = None


def _vector(values: Sequence[float]) -> np.ndarray:
    # pgvector may hand back its own Vector type (binary results); accept it like any sequence.
    if hasattr(values, "to_numpy"):
        values = values.to_numpy()
    return np.asarray(values, dtype=np.float32)


def insert_distillation(conn: psycopg.Connection, new: NewDistillation, *, actor: str = "pipeline") -> UUID:
    """Store a distillation (status from the confidence gate) with its first version.

    The gate is applied here, not by the caller, so no path can store an ungated row; the
    database's CHECK constraints hold the same rule.
    """
    if new.tier not in TIERS:
        raise ValueError(f"unknown tier {new.tier!r}")
    if new.memory_type not in MEMORY_TYPES:
        raise ValueError(f"unknown memory type {new.memory_type!r}")
    decision = confidence_gate(new.confidence)
    embedding = _vector(new.embedding)
    distillation_id = one_value(
        conn,
        """INSERT INTO distillations (memory_id, user_id, content, confidence, tier, status, needs_review,
                                      embedding, embedding_model, prompt_version, schema_version, refreshed_at,
                                      memory_type, event_on)
           VALUES (%(memory_id)s, %(user_id)s, %(content)s, %(confidence)s, %(tier)s, %(status)s,
                   %(needs_review)s, %(embedding)s, %(embedding_model)s, %(prompt_version)s, %(schema_version)s,
                   %(refreshed_at)s, %(memory_type)s, %(event_on)s) RETURNING id""",
        {"memory_id": str(new.memory_id), "user_id": new.user_id, "content": new.content,
         "confidence": new.confidence, "tier": new.tier, "status": decision.status,
         "needs_review": decision.needs_review, "embedding": embedding, "embedding_model": new.embedding_model,
         "prompt_version": new.prompt_version, "schema_version": new.schema_version,
         "refreshed_at": new.refreshed_at, "memory_type": new.memory_type, "event_on": new.event_on},
        UUID,
    )
    _write_version(conn, distillation_id, user_id=new.user_id, content=new.content, vector=embedding,
                   embedding_model=new.embedding_model, prompt_version=new.prompt_version, reason="distilled",
                   actor=actor, action="distil",
                   detail={"memory_id": str(new.memory_id), "status": decision.status,
                           "confidence": new.confidence, "tier": new.tier, "memory_type": new.memory_type})
    return distillation_id


def _write_version(
    conn: psycopg.Connection,
    distillation_id: UUID | str,
    *,
    user_id: str,
    content: str,
    vector: np.ndarray,
    embedding_model: str,
    prompt_version: str | None,
    reason: str,
    actor: str,
    action: str,
    merged_from: Sequence[UUID | str] = (),
    detail: dict[str, Any] | None = None,
) -> int:
    """The one writer of a distillation's text history: the next version row and its audit row.

    Every content change of a distillation (its first text in ``insert_distillation``, each later
    one in ``add_version``) goes through here, so none can skip its version or its audit row.
    Returns the new version number; ``detail`` defaults to the version, reason and sources.
    """
    merged = [str(m) for m in merged_from]
    version = one_value(
        conn,
        """INSERT INTO distillation_versions (distillation_id, version, content, embedding, embedding_model,
                                              prompt_version, reason, merged_from)
           SELECT %(id)s, coalesce(max(version), 0) + 1, %(content)s, %(embedding)s, %(model)s,
                  %(prompt)s, %(reason)s, %(merged)s::uuid[]
           FROM distillation_versions WHERE distillation_id = %(id)s
           RETURNING version""",
        {"id": str(distillation_id), "content": content, "embedding": vector, "model": embedding_model,
         "prompt": prompt_version, "reason": reason, "merged": merged},
        int,
    )
    write_audit(conn, actor=actor, action=action, target_type="distillation", target_id=distillation_id,
                user_id=user_id,
                detail=detail if detail is not None else {"version": version, "reason": reason, "merged_from": merged})
    return version


def add_version(
    conn: psycopg.Connection,
    distillation_id: UUID | str,
    *,
    content: str,
    embedding: Sequence[float],
    embedding_model: str,
    reason: str,
    merged_from: Sequence[UUID | str] = (),
    prompt_version: str | None = None,
    refreshed_at: datetime | None = None,
    actor: str = "pipeline",
) -> int:
    """Give a distillation new content: write the next version and update the live row.

    Returns the new version number. The row is locked first so concurrent versions of one
    distillation serialise instead of both claiming the same number.
    """
    row = conn.execute(
        "SELECT user_id FROM distillations WHERE id = %(distillation_id)s AND deleted_at IS NULL FOR UPDATE", {"distillation_id": str(distillation_id)}
    ).fetchone()
    if row is None:
        raise LookupError(f"distillation {distillation_id} not found")
    vector = _vector(embedding)
    conn.execute(
        """UPDATE distillations
           SET content = %(content)s, embedding = %(embedding)s, embedding_model = %(model)s,
               prompt_version = coalesce(%(prompt)s, prompt_version),
               refreshed_at = coalesce(%(refreshed)s, now()), updated_at = now()
           WHERE id = %(id)s""",
        {"id": str(distillation_id), "content": content, "embedding": vector, "model": embedding_model,
         "prompt": prompt_version, "refreshed": refreshed_at},
    )
    return _write_version(conn, distillation_id, user_id=row[0], content=content, vector=vector,
                          embedding_model=embedding_model, prompt_version=prompt_version, reason=reason,
                          actor=actor, action="version", merged_from=merged_from)


def set_distillation_status(
    conn: psycopg.Connection,
    distillation_id: UUID | str,
    *,
    status: str,
    needs_review: bool | None = None,
    actor: str = "pipeline",
    action: str = "status",
) -> bool:
    """Change a distillation's status (merge, approve, reject); False when it does not exist."""
    cur = conn.execute(
        """UPDATE distillations SET status = %(status)s, needs_review = coalesce(%(needs_review)s, needs_review), updated_at = now()
           WHERE id = %(distillation_id)s AND deleted_at IS NULL RETURNING user_id""",
        {"status": status, "needs_review": needs_review, "distillation_id": str(distillation_id)},
    )
    row = cur.fetchone()
    if row is None:
        return False
    write_audit(conn, actor=actor, action=action, target_type="distillation", target_id=distillation_id,
                user_id=row[0], detail={"status": status})
    return True


def set_user_weight(conn: psycopg.Connection, distillation_id: UUID | str, *, user_weight: float,
                    user_id: str | None = None, actor: str = "system") -> float | None:
    """Pin (or unpin) a distillation: its ``user_weight``, a factor of recall's gravity (DESIGN §4).

    Returns the previous weight, or None when there is no such live distillation (for ``user_id``).
    The database allows (0, 10]; a value outside is a ``ValueError`` here, before any write.
    """
    if not 0.0 < user_weight <= MAX_USER_WEIGHT:
        raise ValueError(f"user_weight must be above 0 and at most {MAX_USER_WEIGHT:g}, got {user_weight!r}")
    row = _set_live_column(conn, distillation_id, "user_weight", user_weight, user_id=user_id)
    if row is None:
        return None
    write_audit(conn, actor=actor, action="weight", target_type="distillation", target_id=distillation_id,
                user_id=row[0], detail={"before": row[1], "after": user_weight})
    return float(row[1])


def _set_live_column(conn: psycopg.Connection, distillation_id: UUID | str, column: str, value: object, *,
                     user_id: str | None) -> tuple[str, Any] | None:
    """Set one column of a live distillation (of ``user_id``, when given) under a row lock; its user and
    the column's previous value, or None when there is no such distillation."""
    query = sql.SQL(
        """UPDATE distillations d SET {column} = %(value)s, updated_at = now()
           FROM (SELECT id, {column} FROM distillations
                 WHERE id = %(id)s AND deleted_at IS NULL AND (%(user)s::text IS NULL OR user_id = %(user)s)
                 FOR UPDATE) before
           WHERE d.id = before.id RETURNING d.user_id, before.{column}""").format(column=sql.Identifier(column))
    return conn.execute(query, {"value": value, "id": str(distillation_id), "user": user_id}).fetchone()


def set_tier(conn: psycopg.Connection, distillation_id: UUID | str, *, tier: str, user_id: str | None = None,
             actor: str = "system") -> str | None:
    """A person's importance tier for a distillation (recall's tier multiplier and threshold, DESIGN §4).

    Returns the previous tier, or None when there is no such live distillation (for ``user_id``).
    A tier outside :data:`~yak_pipeline.core.types.TIERS` is a ``ValueError`` here, before any write.
    """
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {', '.join(TIERS)}, got {tier!r}")
    row = _set_live_column(conn, distillation_id, "tier", tier, user_id=user_id)
    if row is None:
        return None
    # Setting the tier it already has changes nothing and is not worth an audit row.
    if row[1] != tier:
        write_audit(conn, actor=actor, action="tier", target_type="distillation", target_id=distillation_id,
                    user_id=row[0], detail={"before": row[1], "after": tier})
    return str(row[1])


def supersession_of(conn: psycopg.Connection, distillation_id: UUID | str) -> dict[str, Any]:
    """What replaced a distillation and what it replaced, each with its text and when it was said.

    ``superseded_by`` is the live newer distillation (None when there is none, or it was
    forgotten: then this one is current again, as recall treats it); ``supersedes`` lists the
    live older ones it replaced, oldest first.
    """
    with conn.cursor(row_factory=dict_row) as cur:
        newer = cur.execute(
            """SELECT s.id, s.content, m.occurred_at AS said_at, d.superseded_at
               FROM distillations d
               JOIN distillations s ON s.id = d.superseded_by AND s.deleted_at IS NULL
               JOIN memories m ON m.id = s.memory_id
               WHERE d.id = %(distillation_id)s""",
            {"distillation_id": str(distillation_id)},
        ).fetchone()
        older = cur.execute(
            """SELECT o.id, o.content, m.occurred_at AS said_at
               FROM distillations o JOIN memories m ON m.id = o.memory_id
               WHERE o.superseded_by = %(distillation_id)s AND o.deleted_at IS NULL
               ORDER BY m.occurred_at, o.id""",
            {"distillation_id": str(distillation_id)},
        ).fetchall()
    return {"superseded_by": newer, "supersedes": older}


def flag_for_review(conn: psycopg.Connection, distillation_ids: Sequence[UUID | str]) -> None:
    """Set ``needs_review`` on distillations (e.g. both sides of a conflict)."""
    conn.execute(
        "UPDATE distillations SET needs_review = true, updated_at = now() WHERE id = ANY(%(distillation_ids)s::uuid[])",
        {"distillation_ids": [str(i) for i in distillation_ids]},
    )


def mark_superseded_by_newer(conn: psycopg.Connection, a: UUID | str, b: UUID | str, *, actor: str,
                             user_id: str) -> str | None:
    """Of two contradicting distillations, mark the one stated earlier as superseded by the later one.

    A knowledge update ("I moved to Porto" after "I live in Lisbon"): the older stays, with its
    versions, and recall ranks it below the newer and marks it in the memory block. Nothing is
    marked when both were stated at the same moment (no way to tell which is current), nor when
    a statement later than the newer one (not forgotten) already supersedes the older. Returns the
    id of the superseded distillation, or None.
    """
    # When each was said (its exchange's time), not when it was last edited.
    rows = conn.execute(
        """SELECT d.id, m.occurred_at FROM distillations d JOIN memories m ON m.id = d.memory_id
           WHERE d.id = ANY(%(pair)s::uuid[]) AND d.user_id = %(user_id)s AND d.deleted_at IS NULL""",
        {"pair": [str(a), str(b)], "user_id": user_id},
    ).fetchall()
    if len(rows) != 2 or rows[0][1] == rows[1][1]:
        return None
    (older, _), (newer, newer_at) = sorted(rows, key=lambda r: r[1])
    # Of several later statements it contradicts, the latest supersedes it (then the id, for the
    # same moment), whatever order the conflicts are recorded in (conflict checks run side by side).
    updated = conn.execute(
        """UPDATE distillations d SET superseded_by = %(newer)s, superseded_at = now(), updated_at = now()
           WHERE d.id = %(older)s AND d.superseded_by IS DISTINCT FROM %(newer)s
             AND NOT EXISTS (SELECT 1 FROM distillations s JOIN memories m ON m.id = s.memory_id
                             WHERE s.id = d.superseded_by AND s.deleted_at IS NULL
                               AND (m.occurred_at, s.id) > (%(newer_at)s, %(newer)s::uuid))
           RETURNING d.id""",
        {"newer": newer, "older": older, "newer_at": newer_at},
    ).fetchone()
    if updated is None:
        return None
    write_audit(conn, actor=actor, action="supersede", target_type="distillation", target_id=older,
                user_id=user_id, detail={"superseded_by": str(newer)})
    return str(older)


def get_distillation(
    conn: psycopg.Connection, distillation_id: UUID | str, *, user_id: str | None = None
) -> dict[str, Any] | None:
    """One live distillation; with ``user_id``, only if it is that user's."""
    return live_row(conn, "distillations", _COLUMNS, distillation_id, user_id=user_id)


def list_distillations(
    conn: psycopg.Connection,
    *,
    user_id: str | None = None,
    status: str | None = None,
    memory_id: UUID | str | None = None,
    needs_review: bool | None = None,
    limit: int = 50,
    offset: int = 0,
) -> list[dict[str, Any]]:
    """Live distillations, newest first, filtered by user, status, source memory or review flag."""
    return list_live_rows(conn, "distillations", _COLUMNS, order_by="created_at DESC, id", limit=limit, offset=offset,
                          where={"user_id": user_id, "status": status, "needs_review": needs_review,
                                 "memory_id": None if memory_id is None else UUID(str(memory_id))})


def list_versions(conn: psycopg.Connection, distillation_id: UUID | str) -> list[dict[str, Any]]:
    """A distillation's live versions, oldest first."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT id, distillation_id, version, content, embedding_model, prompt_version, reason,
                      merged_from, created_at
               FROM distillation_versions WHERE distillation_id = %(distillation_id)s AND deleted_at IS NULL
               ORDER BY version""",
            {"distillation_id": str(distillation_id)},
        ).fetchall()


def nearest_active(
    conn: psycopg.Connection,
    *,
    user_id: str,
    embedding: Sequence[float],
    embedding_model: str,
    limit: int = 5,
    exclude_id: UUID | str | None = None,
) -> list[Neighbour]:
    """The user's active distillations nearest to ``embedding`` (for dedup and conflict checks).

    Exact: the user's active rows are scanned (through the ``(user_id, status)`` index) and
    ranked by distance. Left to itself the planner walks the table-wide HNSW index and filters
    the user's rows out of its ~40 candidates afterwards, which returns fewer than ``limit``
    rows — or misses the true nearest — as soon as other users' rows crowd the neighbourhood,
    and costs more than ranking one user's rows outright. Equal distances go to the older row,
    as in :mod:`yak_pipeline.core.dedup`, so the result never depends on row order.
    """
    rows = conn.execute(
        """WITH candidates AS MATERIALIZED (
               SELECT id, user_id, status, created_at, embedding FROM distillations
               WHERE user_id = %(user)s AND status = 'active' AND deleted_at IS NULL
                 AND embedding_model = %(model)s AND (%(exclude)s::uuid IS NULL OR id <> %(exclude)s::uuid))
           SELECT id, user_id, 1 - (embedding <=> %(q)s) AS similarity, status, created_at
           FROM candidates
           ORDER BY embedding <=> %(q)s, created_at, id LIMIT %(limit)s""",
        {"q": _vector(embedding), "user": user_id, "model": embedding_model,
         "exclude": None if exclude_id is None else str(exclude_id), "limit": limit},
    ).fetchall()
    return [Neighbour(id=str(r[0]), user_id=r[1], similarity=float(r[2]), status=r[3], created_at=r[4]) for r in rows]


def contents_by_id(conn: psycopg.Connection, distillation_ids: Sequence[UUID | str]) -> dict[str, str]:
    """The current text of each distillation, by id (one round trip)."""
    if not distillation_ids:
        return {}
    return dict(conn.execute("SELECT id::text, content FROM distillations WHERE id = ANY(%(distillation_ids)s::uuid[])",
                             {"distillation_ids": [str(i) for i in distillation_ids]}).fetchall())


class LiveDistillation(NamedTuple):
    """A memory's live distillation, as re-distilling it after a prompt change needs it."""

    id: UUID
    prompt_version: str
    schema_version: int


def live_distillation_of(conn: psycopg.Connection, memory_id: UUID | str) -> LiveDistillation | None:
    """A memory's live distillation (active or in review), the oldest when there are more."""
    with conn.cursor(row_factory=class_row(LiveDistillation)) as cur:
        return cur.execute(
            """SELECT id, prompt_version, schema_version FROM distillations
               WHERE memory_id = %(memory_id)s AND deleted_at IS NULL AND status IN ('active', 'review')
               ORDER BY created_at LIMIT 1""",
            {"memory_id": str(memory_id)},
        ).fetchone()


def redistill(conn: psycopg.Connection, distillation_id: UUID | str, *, content: str, embedding: Sequence[float],
              embedding_model: str, confidence: float, tier: str, prompt_version: str, schema_version: int,
              refreshed_at: datetime | None, memory_type: str = "fact", event_on: date | None = None) -> None:
    """A memory distilled again (after a prompt change): new text as a version, new gate and checks.

    An unchanged text needs no new version; the row still records the new prompt version. The
    confidence gate is applied here as in ``insert_distillation``, and both consolidation checks
    start over for the new text.
    """
    current = one_value(conn, "SELECT content FROM distillations WHERE id = %(distillation_id)s",
                        {"distillation_id": str(distillation_id)}, str)
    if current != content:
        add_version(conn, distillation_id, content=content, embedding=embedding, embedding_model=embedding_model,
                    reason="redistilled", prompt_version=prompt_version, refreshed_at=refreshed_at)
    decision = confidence_gate(confidence)
    conn.execute(
        """UPDATE distillations SET confidence = %(confidence)s, tier = %(tier)s, status = %(status)s, needs_review = %(needs_review)s,
                  prompt_version = %(prompt_version)s, schema_version = %(schema_version)s, memory_type = %(memory_type)s, event_on = %(event_on)s,
                  conflict_checked_at = NULL, dedup_checked_at = NULL, updated_at = now()
           WHERE id = %(distillation_id)s""",
        {"confidence": confidence, "tier": tier, "status": decision.status, "needs_review": decision.needs_review,
         "prompt_version": prompt_version, "schema_version": schema_version, "memory_type": memory_type,
         "event_on": event_on, "distillation_id": str(distillation_id)},
    )


def status_counts(conn: psycopg.Connection) -> dict[str, int]:
    """How many live distillations have each status."""
    return dict(conn.execute(
        "SELECT status, count(*) FROM distillations WHERE deleted_at IS NULL GROUP BY status").fetchall())
