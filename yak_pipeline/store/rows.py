"""Reads that memories, distillations and turns share the shape of: one live row by id, a page of
live rows filtered by their columns, and the pending rows of a user's day claimed for a worker.

Each store module owns its table and its column list; these only spell the statement once.
``table`` and ``columns`` are the caller's constants (identifiers and a column list), never input.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import date
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar
from uuid import UUID

import psycopg
from psycopg import sql
from psycopg.abc import Params, QueryNoTemplate
from psycopg.rows import BaseRowFactory, RowMaker, dict_row, scalar_row

if TYPE_CHECKING:  # the cursor type psycopg.rows names its factories' argument by (not exported)
    from psycopg._cursor_base import BaseCursor

T = TypeVar("T")
RowT = TypeVar("RowT", bound=NamedTuple)


class PendingPartition(NamedTuple):
    """A partition (a user's UTC day) with work left, for the sensors and ``yak process``."""

    user_id: str
    day: date
    rows: int  # rows of work left
    signature: str  # changes whenever the pending work does: a run key built from it is one per state


def uuid_array(ids: Iterable[str | UUID]) -> str:
    """Ids (uuids as text) as one array literal, for a ``%(ids)s::uuid[]`` parameter.

    psycopg adapts a list element by element (a regular expression each, to quote it): 0.33 ms
    for the 130 ids of a recall's candidates, half the time of the query they were sent with. A
    uuid needs no quoting; anything that is not one fails the cast.
    """
    return "{" + ",".join(map(str, ids)) + "}"


def tuple_row_of(row_type: type[RowT]) -> BaseRowFactory[RowT]:
    """A row factory building each row as ``row_type`` (a NamedTuple) by position, once the
    statement's column names are checked to be its fields.

    For the queries every recall runs: the check is once per statement, and a row costs one
    ``_make`` more than a plain tuple, where ``class_row`` builds a dict of keyword arguments first.
    """
    def maker(cursor: BaseCursor[Any, Any]) -> RowMaker[RowT]:
        names = tuple(column.name for column in cursor.description or ())
        if names and names != row_type._fields:
            raise TypeError(f"{row_type.__name__} reads columns {row_type._fields}, the statement returns {names}")
        return row_type._make
    return maker


def one_value(conn: psycopg.Connection, query: QueryNoTemplate, params: Params | None, value_type: type[T]) -> T:
    """The value of a statement that always returns one row of one column (an aggregate, an
    ``EXISTS``, the ``RETURNING`` of an insert that cannot be skipped), checked to be a ``value_type``."""
    with conn.cursor(row_factory=scalar_row) as cur:
        value = cur.execute(query, params).fetchone()
    if not isinstance(value, value_type):
        raise TypeError(f"expected one {value_type.__name__}, the statement returned {value!r}")
    return value


def live_row(conn: psycopg.Connection, table: str, columns: str, row_id: UUID | str, *,
             user_id: str | None = None) -> dict[str, Any] | None:
    """One live (not forgotten) row of ``table`` by id as a dict; with ``user_id``, only if it is theirs."""
    query = sql.SQL("SELECT {columns} FROM {table} WHERE id = %(id)s AND deleted_at IS NULL "
                    "AND (%(user)s::text IS NULL OR user_id = %(user)s)").format(
        columns=sql.SQL(columns), table=sql.Identifier(table))
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query, {"id": str(row_id), "user": user_id}).fetchone()


def claim_pending_rows(conn: psycopg.Connection, table: str, columns: str, *, user_id: str | None,
                       day: date | None, limit: int) -> list[dict[str, Any]]:
    """Lock and return up to ``limit`` pending live rows of ``table`` (of one user and UTC day when
    given), oldest first.

    ``FOR UPDATE SKIP LOCKED``: concurrent workers never claim the same row, so none is worked
    twice. The locks hold until the caller's transaction ends.
    """
    query = sql.SQL("""SELECT {columns} FROM {table}
        WHERE status = 'pending' AND deleted_at IS NULL
          AND (%(user)s::text IS NULL OR user_id = %(user)s)
          AND (%(day)s::date IS NULL OR (occurred_at AT TIME ZONE 'UTC')::date = %(day)s)
        ORDER BY occurred_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED""").format(columns=sql.SQL(columns), table=sql.Identifier(table))
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query, {"user": user_id, "day": day, "limit": limit}).fetchall()


def list_live_rows(conn: psycopg.Connection, table: str, columns: str, *, where: Mapping[str, Any], order_by: str,
                   limit: int, offset: int) -> list[dict[str, Any]]:
    """A page of live rows of ``table`` in ``order_by`` order (the caller's constant): those whose
    ``where`` columns equal the values given, a value of None matching any row."""
    given = {column: value for column, value in where.items() if value is not None}
    # The caller's columns are identifiers; their values go by numbered name (w0, w1...), never by text.
    params: dict[str, Any] = {f"w{position}": value for position, value in enumerate(given.values())}
    conditions = [sql.SQL("deleted_at IS NULL")] + [
        sql.SQL("{} = {}").format(sql.Identifier(column), sql.Placeholder(f"w{position}"))
        for position, column in enumerate(given)]
    query = sql.SQL("SELECT {columns} FROM {table} WHERE {conditions} ORDER BY {order} LIMIT %(limit)s OFFSET %(offset)s").format(
        columns=sql.SQL(columns), table=sql.Identifier(table), conditions=sql.SQL(" AND ").join(conditions),
        order=sql.SQL(order_by))
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query, {**params, "limit": limit, "offset": offset}).fetchall()
