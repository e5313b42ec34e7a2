"""What a recall hit shows, read by id once recall has ranked them: a distillation's text and
standing, or an exchange's own words (a raw hit).

These run on every recall (``services.recall_hits``): one round trip per kind, the rows built
straight into their typed shape (``rows.tuple_row_of``), nothing more per row.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime
from typing import NamedTuple
from uuid import UUID

import psycopg

from yak_pipeline.store.rows import tuple_row_of, uuid_array


class DistilledHitRow(NamedTuple):
    """A recalled distillation as a hit shows it."""

    id: UUID
    memory_id: UUID
    content: str
    confidence: float
    occurred_at: datetime  # when its exchange was said
    in_conflict: bool  # an open conflict names it
    memory_type: str
    event_on: date | None


class RawHitRow(NamedTuple):
    """A recalled exchange (the user's own words) as a hit shows it."""

    id: str
    content: str
    occurred_at: datetime


def recall_hit_rows(conn: psycopg.Connection, distillation_ids: Sequence[str]) -> dict[str, DistilledHitRow]:
    """What each recalled distillation shows, by id (as text)."""
    with conn.cursor(row_factory=tuple_row_of(DistilledHitRow)) as cur:
        rows = cur.execute(
            """SELECT d.id, d.memory_id, d.content, d.confidence, m.occurred_at,
                      EXISTS (SELECT 1 FROM conflicts c WHERE c.status = 'open'
                                AND (c.distillation_a = d.id OR c.distillation_b = d.id)) AS in_conflict,
                      d.memory_type, d.event_on
               FROM distillations d JOIN memories m ON m.id = d.memory_id
               WHERE d.id = ANY(%(distillation_ids)s::uuid[])""",
            {"distillation_ids": uuid_array(distillation_ids)},
        ).fetchall()
    return {str(r.id): r for r in rows}


def raw_hit_rows(conn: psycopg.Connection, memory_ids: Sequence[UUID | str]) -> dict[str, RawHitRow]:
    """What each recalled exchange shows, by id (as text); a forgotten one is left out."""
    if not memory_ids:
        return {}
    with conn.cursor(row_factory=tuple_row_of(RawHitRow)) as cur:
        rows = cur.execute(
            """SELECT id::text AS id, content, occurred_at FROM memories
               WHERE id = ANY(%(memory_ids)s::uuid[]) AND deleted_at IS NULL""",
            {"memory_ids": [str(i) for i in memory_ids]},
        ).fetchall()
    return {r.id: r for r in rows}
