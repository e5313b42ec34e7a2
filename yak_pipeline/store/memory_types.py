"""Distillations' memory types (sql/017): the offline typing of existing rows, a person's change of
type (audited with before and after)."""

from __future__ import annotations

from datetime import date
from typing import NamedTuple
from uuid import UUID

import psycopg

from yak_pipeline.core.exchanges import users_words
from yak_pipeline.core.memory_types import classify_memory, typed
from yak_pipeline.core.types import MEMORY_TYPES, MemoryType
from yak_pipeline.store.audit import write_audit


def type_distillations(conn: psycopg.Connection, *, user_id: str | None = None, batch: int = 2000) -> int:
    """Type every distillation (of ``user_id``, or everyone) from its exchange's words with the offline
    classifier, an event dated against when it was said; how many are not ``fact``. Used once, when
    the column first appears (the migration): afterwards the distiller types each new one."""
    typed_count = 0
    last = None
    while True:
        rows = conn.execute(
            """SELECT d.id, m.content, m.occurred_at FROM distillations d JOIN memories m ON m.id = d.memory_id
                WHERE (%(user)s::text IS NULL OR d.user_id = %(user)s)
                  AND (%(last)s::uuid IS NULL OR d.id > %(last)s::uuid)
                ORDER BY d.id LIMIT %(batch)s""",
            {"user": user_id, "last": last, "batch": batch}).fetchall()
        if not rows:
            return typed_count
        found = [(distillation_id, classify_memory(users_words(content)[0], occurred_at.date()))
                 for distillation_id, content, occurred_at in rows]
        changed = [{"memory_type": t.memory_type, "event_on": t.event_on, "id": distillation_id}
                   for distillation_id, t in found if t.memory_type != "fact"]
        if changed:
            with conn.cursor() as cur:
                cur.executemany("UPDATE distillations SET memory_type = %(memory_type)s, event_on = %(event_on)s"
                                " WHERE id = %(id)s", changed)
        typed_count += len(changed)
        last = rows[-1][0]


class TypeBefore(NamedTuple):
    """A distillation's type and event day before a person changed them."""

    memory_type: str
    event_on: date | None


def set_memory_type(conn: psycopg.Connection, distillation_id: UUID | str, *, memory_type: str,
                    user_id: str | None = None, actor: str = "system") -> TypeBefore | None:
    """A person's type for a distillation; an event is dated from its exchange's words (against when
    they were said), any other type has no day. Returns the previous type and day, or None
    when there is no such live distillation (for ``user_id``). A type outside
    :data:`~yak_pipeline.core.types.MEMORY_TYPES` is a ``ValueError`` here, before any write."""
    if memory_type not in MEMORY_TYPES:
        raise ValueError(f"type must be one of {', '.join(MEMORY_TYPES)}, got {memory_type!r}")
    row = conn.execute(
        """SELECT d.user_id, d.memory_type, d.event_on, d.content, m.content, m.occurred_at
             FROM distillations d JOIN memories m ON m.id = d.memory_id
            WHERE d.id = %(distillation_id)s AND d.deleted_at IS NULL AND (%(user_id)s::text IS NULL OR d.user_id = %(user_id)s)
            FOR UPDATE OF d""",
        {"distillation_id": str(distillation_id), "user_id": user_id}).fetchone()
    if row is None:
        return None
    owner, before_type, before_day, distilled, exchange, occurred_at = row
    kind: MemoryType = memory_type  # checked against MEMORY_TYPES above
    # An event keeps the day it has (a person's type change does not move it); else it is read again.
    after = typed(kind, users_words(exchange)[0], occurred_at.date(), distilled=distilled)
    event_on = before_day if kind == "event" and before_type == "event" and before_day else after.event_on
    if (before_type, before_day) == (kind, event_on):
        return TypeBefore(before_type, before_day)  # nothing changes: no write, no audit row
    conn.execute("UPDATE distillations SET memory_type = %(kind)s, event_on = %(event_on)s, updated_at = now() WHERE id = %(distillation_id)s",
                 {"kind": kind, "event_on": event_on, "distillation_id": str(distillation_id)})
    write_audit(conn, actor=actor, action="type", target_type="distillation", target_id=distillation_id,
                user_id=owner, detail={"before": before_type, "after": kind,
                                       "event_on_before": None if before_day is None else before_day.isoformat(),
                                       "event_on_after": None if event_on is None else event_on.isoformat()})
    return TypeBefore(before_type, before_day)
