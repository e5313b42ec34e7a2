"""Distillations and their versions: every content change writes a version, nothing is lost."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any
from uuid import UUID

import numpy as np
import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from yak_pipeline.core.dedup import Neighbour
from yak_pipeline.core.gates import confidence_gate
from yak_pipeline.core.types import TIERS
from yak_pipeline.store.audit import write_audit

# The schema's CHECK on user_weight: (0, 10]. 1 is neutral; a pinned memory weighs more.
MAX_USER_WEIGHT = 10.0

_COLUMNS = (
    "id, memory_id, user_id, content, confidence, tier, warmth, user_weight, status, needs_review, "
    "embedding_model, prompt_version, schema_version, refreshed_at, created_at, updated_at"
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
    decision = confidence_gate(new.confidence)
    embedding = _vector(new.embedding)
    distillation_id = conn.execute(
        """INSERT INTO distillations (memory_id, user_id, content, confidence, tier, status, needs_review,
                                      embedding, embedding_model, prompt_version, schema_version, refreshed_at)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id""",
        (str(new.memory_id), new.user_id, new.content, new.confidence, new.tier, decision.status,
         decision.needs_review, embedding, new.embedding_model, new.prompt_version, new.schema_version,
         new.refreshed_at),
    ).fetchone()[0]
    conn.execute(
        """INSERT INTO distillation_versions (distillation_id, version, content, embedding, embedding_model,
                                              prompt_version, reason)
           VALUES (%s, 1, %s, %s, %s, %s, 'distilled')""",
        (distillation_id, new.content, embedding, new.embedding_model, new.prompt_version),
    )
    write_audit(conn, actor=actor, action="distil", target_type="distillation", target_id=distillation_id,
                user_id=new.user_id, detail={"memory_id": str(new.memory_id), "status": decision.status,
                                             "confidence": new.confidence, "tier": new.tier})
    return distillation_id


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
        "SELECT user_id FROM distillations WHERE id = %s AND deleted_at IS NULL FOR UPDATE", (str(distillation_id),)
    ).fetchone()
    if row is None:
        raise LookupError(f"distillation {distillation_id} not found")
    vector = _vector(embedding)
    version = conn.execute(
        """INSERT INTO distillation_versions (distillation_id, version, content, embedding, embedding_model,
                                              prompt_version, reason, merged_from)
           SELECT %(id)s, coalesce(max(version), 0) + 1, %(content)s, %(embedding)s, %(model)s,
                  %(prompt)s, %(reason)s, %(merged)s::uuid[]
           FROM distillation_versions WHERE distillation_id = %(id)s
           RETURNING version""",
        {"id": str(distillation_id), "content": content, "embedding": vector, "model": embedding_model,
         "prompt": prompt_version, "reason": reason, "merged": [str(m) for m in merged_from]},
    ).fetchone()[0]
    conn.execute(
        """UPDATE distillations
           SET content = %(content)s, embedding = %(embedding)s, embedding_model = %(model)s,
               prompt_version = coalesce(%(prompt)s, prompt_version),
               refreshed_at = coalesce(%(refreshed)s, now()), updated_at = now()
           WHERE id = %(id)s""",
        {"id": str(distillation_id), "content": content, "embedding": vector, "model": embedding_model,
         "prompt": prompt_version, "refreshed": refreshed_at},
    )
    write_audit(conn, actor=actor, action="version", target_type="distillation", target_id=distillation_id,
                user_id=row[0], detail={"version": version, "reason": reason,
                                        "merged_from": [str(m) for m in merged_from]})
    return version


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
        """UPDATE distillations SET status = %s, needs_review = coalesce(%s, needs_review), updated_at = now()
           WHERE id = %s AND deleted_at IS NULL RETURNING user_id""",
        (status, needs_review, str(distillation_id)),
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
    row = conn.execute(
        """UPDATE distillations d SET user_weight = %(weight)s, updated_at = now()
           FROM (SELECT id, user_weight FROM distillations
                 WHERE id = %(id)s AND deleted_at IS NULL AND (%(user)s::text IS NULL OR user_id = %(user)s)
                 FOR UPDATE) before
           WHERE d.id = before.id RETURNING d.user_id, before.user_weight""",
        {"weight": user_weight, "id": str(distillation_id), "user": user_id},
    ).fetchone()
    if row is None:
        return None
    write_audit(conn, actor=actor, action="weight", target_type="distillation", target_id=distillation_id,
                user_id=row[0], detail={"before": row[1], "after": user_weight})
    return float(row[1])


def flag_for_review(conn: psycopg.Connection, distillation_ids: Sequence[UUID | str]) -> None:
    """Set ``needs_review`` on distillations (e.g. both sides of a conflict)."""
    conn.execute(
        "UPDATE distillations SET needs_review = true, updated_at = now() WHERE id = ANY(%s::uuid[])",
        ([str(i) for i in distillation_ids],),
    )


def mark_superseded_by_newer(conn: psycopg.Connection, a: UUID | str, b: UUID | str, *, actor: str,
                             user_id: str) -> str | None:
    """Of two contradicting distillations, mark the one stated earlier as superseded by the later one.

    A knowledge update ("I moved to Porto" after "I live in Lisbon"): the older stays, with its
    versions, and recall ranks it below the newer and marks it in the memory block. Nothing is
    marked when both were stated at the same moment (no way to tell which is current). Returns
    the id of the superseded distillation, or None.
    """
    # When each was said (its exchange's time), not when it was last edited.
    rows = conn.execute(
        """SELECT d.id, m.occurred_at FROM distillations d JOIN memories m ON m.id = d.memory_id
           WHERE d.id = ANY(%s::uuid[]) AND d.user_id = %s AND d.deleted_at IS NULL""",
        ([str(a), str(b)], user_id),
    ).fetchall()
    if len(rows) != 2 or rows[0][1] == rows[1][1]:
        return None
    (older, _), (newer, _) = sorted(rows, key=lambda r: r[1])
    updated = conn.execute(
        """UPDATE distillations SET superseded_by = %s, superseded_at = now(), updated_at = now()
           WHERE id = %s AND superseded_by IS DISTINCT FROM %s RETURNING id""",
        (newer, older, newer),
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
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            f"""SELECT {_COLUMNS} FROM distillations
                WHERE id = %(id)s AND deleted_at IS NULL AND (%(user)s::text IS NULL OR user_id = %(user)s)""",
            {"id": str(distillation_id), "user": user_id},
        ).fetchone()


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
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            f"""SELECT {_COLUMNS} FROM distillations
                WHERE deleted_at IS NULL
                  AND (%(user)s::text IS NULL OR user_id = %(user)s)
                  AND (%(status)s::text IS NULL OR status = %(status)s)
                  AND (%(memory)s::uuid IS NULL OR memory_id = %(memory)s::uuid)
                  AND (%(review)s::boolean IS NULL OR needs_review = %(review)s)
                ORDER BY created_at DESC, id LIMIT %(limit)s OFFSET %(offset)s""",
            {"user": user_id, "status": status, "memory": None if memory_id is None else str(memory_id),
             "review": needs_review, "limit": limit, "offset": offset},
        ).fetchall()


def list_versions(conn: psycopg.Connection, distillation_id: UUID | str) -> list[dict[str, Any]]:
    """A distillation's live versions, oldest first."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT id, distillation_id, version, content, embedding_model, prompt_version, reason,
                      merged_from, created_at
               FROM distillation_versions WHERE distillation_id = %s AND deleted_at IS NULL
               ORDER BY version""",
            (str(distillation_id),),
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


def partition_distillations(conn: psycopg.Connection, *, user_id: str, day: date) -> list[dict[str, Any]]:
    """A user's day of live distillations (by the exchange's date), with embeddings, for the quality gate."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT d.id, d.content, d.confidence, d.tier, d.status, vector_dims(d.embedding) AS embedding_dim
               FROM distillations d JOIN memories m ON m.id = d.memory_id
               WHERE d.user_id = %s AND d.deleted_at IS NULL AND (m.occurred_at AT TIME ZONE 'UTC')::date = %s""",
            (user_id, day),
        ).fetchall()


def record_partition_gate(conn: psycopg.Connection, *, user_id: str, day: date, passed: bool, failures: Sequence[str]) -> None:
    """Store the quality gate's latest verdict on a partition."""
    conn.execute(
        """INSERT INTO partition_gates (user_id, day, passed, failures) VALUES (%s, %s, %s, %s)
           ON CONFLICT (user_id, day) DO UPDATE SET passed = EXCLUDED.passed, failures = EXCLUDED.failures,
                                                   checked_at = now()""",
        (user_id, day, passed, Jsonb(list(failures))),
    )


def partition_gate_passed(conn: psycopg.Connection, *, user_id: str, day: date) -> bool | None:
    """The gate's latest verdict on a partition (None: never checked)."""
    row = conn.execute("SELECT passed FROM partition_gates WHERE user_id = %s AND day = %s", (user_id, day)).fetchone()
    return None if row is None else bool(row[0])
