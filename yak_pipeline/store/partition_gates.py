"""A partition's quality gate: the day of distillations it checks, and its verdicts (``partition_gates``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb


def partition_distillations(conn: psycopg.Connection, *, user_id: str, day: date) -> list[dict[str, Any]]:
    """A user's day of live distillations (by the exchange's date), with embeddings, for the quality gate."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT d.id, d.content, d.confidence, d.tier, d.status, vector_dims(d.embedding) AS embedding_dim
               FROM distillations d JOIN memories m ON m.id = d.memory_id
               WHERE d.user_id = %(user_id)s AND d.deleted_at IS NULL AND (m.occurred_at AT TIME ZONE 'UTC')::date = %(day)s""",
            {"user_id": user_id, "day": day},
        ).fetchall()


def record_partition_gate(conn: psycopg.Connection, *, user_id: str, day: date, passed: bool, failures: Sequence[str]) -> None:
    """Store the quality gate's latest verdict on a partition."""
    conn.execute(
        """INSERT INTO partition_gates (user_id, day, passed, failures) VALUES (%(user_id)s, %(day)s, %(passed)s, %(failures)s)
           ON CONFLICT (user_id, day) DO UPDATE SET passed = EXCLUDED.passed, failures = EXCLUDED.failures,
                                                   checked_at = now()""",
        {"user_id": user_id, "day": day, "passed": passed, "failures": Jsonb(list(failures))},
    )


def partition_gate_passed(conn: psycopg.Connection, *, user_id: str, day: date) -> bool | None:
    """The gate's latest verdict on a partition (None: never checked)."""
    row = conn.execute("SELECT passed FROM partition_gates WHERE user_id = %(user_id)s AND day = %(day)s", {"user_id": user_id, "day": day}).fetchone()
    return None if row is None else bool(row[0])
