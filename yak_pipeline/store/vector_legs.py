"""Recall's cosine legs: the user's rows nearest the query, scanned exactly or proposed by HNSW.

The vector legs scan a user's rows exactly when they have few (a few milliseconds, and exact);
otherwise an HNSW index proposes them. A heavy user's own partial index (``store.user_indexes``,
built nightly) holds only their rows: at 100,000 rows of ten users a cosine leg costs about 6 ms
p50 there against 12–13 ms on the shared index, and recall's top 10 equals the exact one for every
query measured (docs/BENCHMARKS.md §2e); it is read without the iterative scan (its beam is all
theirs), and when filters leave that short the exact scan stands in. Until it exists the shared
HNSW index serves, read with
pgvector 0.8's iterative scan (``hnsw.iterative_scan = strict_order``): when the user filter
leaves fewer than ``limit`` rows of the beam, the index scan goes on instead of returning short,
in exact distance order, walking past other users' rows. When even that comes up short
(``hnsw.max_scan_tuples``), the exact scan stands in. ``exact=True`` scans everything exactly:
the reference the benchmark and the tests compare the index paths with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg import sql

from yak_pipeline.store.recall_legs import LEG_WHERE, LegHit
from yak_pipeline.store.rows import one_value
from yak_pipeline.store.user_indexes import USER_INDEX_MIN_ROWS, user_indexes

_MIN_FETCH: Final[int] = 40
# The widest HNSW beam recall asks for; past it an exact scan is the better plan.
MAX_EF_SEARCH: Final[int] = 1000
# The beam is this many times the rows wanted. On a user's own index (pgvector 0.6), 2n gave
# >= 0.99 of the true top-n on 10k rows of 384 dimensions; on the shared index read with the
# iterative scan, 2n gave a top-10 equal to the exact one for 0.985 of the queries at 100k rows
# of ten users (docs/BENCHMARKS.md §2c): the beam's candidates are shared with other users' rows.
_EF_PER_ROW: Final[float] = 4.0
# Below this many rows a user's rows are scanned exactly: it is as fast as the index and exact. From
# it on a user gets their own indexes (store.user_indexes): one line for both.
EXACT_SCAN_MAX_ROWS: Final[int] = USER_INDEX_MIN_ROWS


# --- the index's beam ----------------------------------------------------------------------------


def set_beam(conn: psycopg.Connection, ef_search: int, *, iterative: bool = True) -> None:
    """HNSW ``ef_search``, and whether the scan goes on past the beam (``hnsw.iterative_scan``), for the
    rest of this transaction (``set_config(..., true)``). On a connection in autocommit mode that is
    the implicit transaction the statements of one pipeline share until it syncs: send the search
    in the same pipeline (:func:`vector_search` does).

    The iterative scan is for the shared index, whose beam is mostly other users' rows. A user's
    own index holds only theirs: the beam is enough, and keeping the scan resumable cost 1 ms of
    4.5 per leg (the same 50 rows in each of 450 legs, docs/BENCHMARKS.md §2f). When filters
    leave it short, the exact scan stands in (:func:`vector_search`).
    """
    conn.execute("SELECT set_config('hnsw.ef_search', %(ef_search)s, true), set_config('hnsw.iterative_scan', %(iterative_scan)s, true)",
                 {"ef_search": str(max(min(ef_search, MAX_EF_SEARCH), 1)),
                  "iterative_scan": "strict_order" if iterative else "off"})


def beam_for(rows_wanted: int) -> int:
    """The ``ef_search`` that delivers the true top ``rows_wanted`` of a user's rows reliably."""
    return max(math.ceil(rows_wanted * _EF_PER_ROW), _MIN_FETCH)


# --- the legs -------------------------------------------------------------------------------------


def vector_search(
    conn: psycopg.Connection,
    *,
    table: Literal["memories", "distillations"],
    user_id: str,
    query_embedding: Sequence[float] | npt.NDArray[np.float32],
    embedding_model: str,
    limit: int,
    exact: bool = False,
    as_of: datetime | None = None,
    context: bool = False,
    own_index: bool | None = None,
) -> list[LegHit]:
    """The user's ``limit`` rows of ``table`` most similar to the query (cosine), most similar first.

    With ``exact`` every row of the user is scored; otherwise an HNSW index proposes them when
    that is cheaper — the user's own (``store.user_indexes``) when they have one, else the shared
    one — and an exact scan stands in when the index cannot deliver ``limit`` rows. With
    ``context`` (memories only) each exchange is compared as read with its neighbours
    (``context_embedding``, sql/008). ``own_index`` says whether the user has their own index on
    this column (None: look it up).
    """
    if context and table != "memories":
        raise ValueError("only exchanges (memories) have a conversation context")
    if limit <= 0:
        return []
    column = "context_embedding" if context else "embedding"
    where = LEG_WHERE[table] + f" AND t.{column} IS NOT NULL AND t.{column}_model = %(model)s"
    args = {"q": np.asarray(query_embedding, dtype=np.float32), "user": user_id, "model": embedding_model,
            "n": limit, "as_of": as_of}
    if not exact:
        if own_index is None:
            own_index = (table, column) in user_indexes(conn, user_id)
        # A user's own index holds more rows than an exact scan reads quickly, by construction.
        if own_index or _has_more_rows_than(conn, table=table, where=where, args=args,
                                            rows=max(EXACT_SCAN_MAX_ROWS, limit)):
            # The planner proves a partial index's predicate only from a literal (store.user_indexes).
            mine = sql.SQL(" AND t.user_id = {}").format(sql.Literal(user_id)) if own_index else sql.SQL("")
            # The beam and the search go in one round trip (a pipeline): a wait for the server's
            # answer to set_config cost 0.5 ms p50, and more while other legs held the cores.
            with conn.pipeline():
                set_beam(conn, beam_for(limit), iterative=not own_index)
                if own_index:
                    # Planned once per connection and user, at its first run: planning it each time
                    # weighed every user's partial index against the query, 0.2-0.7 ms of a 2-3 ms leg
                    # at ten users, and PostgreSQL's own choice kept replanning a prepared one. The
                    # plan is the same index scan (same rows, 100 of 100 questions).
                    conn.execute("SELECT set_config('plan_cache_mode', 'force_generic_plan', true)")
                found = conn.execute(
                    sql.SQL(f"SELECT t.id::text, 1 - (t.{column} <=> %(q)s) FROM {table} t WHERE {where}{{mine}} "  # noqa: S608
                            f"ORDER BY t.{column} <=> %(q)s LIMIT %(n)s").format(mine=mine),
                    args, prepare=True if own_index else None,
                )
                if own_index:
                    conn.execute("RESET plan_cache_mode")
            rows = found.fetchall()
            if len(rows) >= limit:
                return [LegHit(id=str(r[0]), score=float(r[1])) for r in rows]
    # Ordering by the similarity expression (not by `embedding <=> q`) keeps the planner off the
    # index: this is the exact scan of the user's rows.
    rows = conn.execute(
        f"SELECT t.id::text, 1 - (t.{column} <=> %(q)s) AS similarity FROM {table} t WHERE {where} "  # noqa: S608
        "ORDER BY similarity DESC, t.id LIMIT %(n)s",
        args,
    ).fetchall()
    return [LegHit(id=str(r[0]), score=float(r[1])) for r in rows]


def _has_more_rows_than(conn: psycopg.Connection, *, table: str, where: str, args: dict[str, Any], rows: int) -> bool:
    """Whether the user has more than ``rows`` candidate rows: reads at most ``rows + 1`` of them.

    A full count of a heavy user's rows cost 21 ms p50 at 10,000 rows, more than the index
    scan it decides about (docs/BENCHMARKS.md); this bounded one reads what the decision needs.
    """
    found = one_value(conn, f"SELECT count(*) FROM (SELECT 1 FROM {table} t WHERE {where} LIMIT %(cap)s) AS f",  # noqa: S608
                      {**args, "cap": rows + 1}, int)
    return found > rows
