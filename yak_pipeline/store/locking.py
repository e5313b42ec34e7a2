"""The one "lock a row, read it, skip if gone" claim that the per-row pipeline stages open with.

Distilling a memory, evaluating a turn and checking a distillation each work on one row in its
own transaction. The row is locked ``FOR UPDATE SKIP LOCKED``: a row another worker holds, or one
forgotten (``deleted_at``) or already done meanwhile, reads as None and the stage skips it.
The store module that owns each table wraps this with its own row type (a NamedTuple whose
fields are the columns read) and conditions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, TypeVar
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.rows import class_row

RowT = TypeVar("RowT", bound=NamedTuple)


def lock_live_row(
    conn: psycopg.Connection,
    table: str,
    row_id: UUID | str,
    row_type: type[RowT],
    *,
    where: Mapping[str, Any] | None = None,
    unset: Sequence[str] = (),
    lock: bool = True,
) -> RowT | None:
    """Lock and read one live row of ``table`` as a ``row_type`` (its fields name the columns read);
    None when it is gone, held elsewhere or not due.

    ``where`` adds ``column = value`` conditions and ``unset`` ``column IS NULL`` ones (a stage's
    "not done yet" marker). ``lock=False`` only reads (a look-ahead that re-checks under the lock later).
    """
    conditions: list[sql.Composable] = [sql.SQL("id = %(id)s"), sql.SQL("deleted_at IS NULL")]
    params: dict[str, Any] = {"id": str(row_id)}
    # The caller's columns are identifiers; their values go by numbered name (w0, w1...), never by text.
    for position, (column, value) in enumerate((where or {}).items()):
        conditions.append(sql.SQL("{} = {}").format(sql.Identifier(column), sql.Placeholder(f"w{position}")))
        params[f"w{position}"] = value
    conditions += [sql.SQL("{} IS NULL").format(sql.Identifier(column)) for column in unset]
    query = sql.SQL("SELECT {columns} FROM {table} WHERE {conditions}{lock}").format(
        columns=sql.SQL(", ").join(sql.Identifier(c) for c in row_type._fields),
        table=sql.Identifier(table),
        conditions=sql.SQL(" AND ").join(conditions),
        lock=sql.SQL(" FOR UPDATE SKIP LOCKED" if lock else ""),
    )
    with conn.cursor(row_factory=class_row(row_type)) as cur:
        return cur.execute(query, params).fetchone()
