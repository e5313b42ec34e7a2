"""The recall query (DESIGN §4): ANN candidates, fetched until provably enough, re-ranked exactly.

The HNSW index only proposes candidates in similarity order. Because every multiplier of the
score is bounded (decay ≤ 1, 1 + warmth ≤ 2, gravity ≤ 2 × max user weight), once the k-th
best score so far beats the best score any not-yet-fetched row could reach, fetching stops
(a threshold algorithm); otherwise the fetch size grows. The final order always comes from
``core.scoring.rank_candidates``, the function the tests' reference ranking uses.

Which index proposes the candidates:

- **the user's own index** — a partial HNSW index ``WHERE user_id = '<user>'``, built by
  :func:`ensure_user_indexes` once a user has :data:`USER_INDEX_MIN_ROWS` rows. pgvector 0.6
  has no iterative scan: a global index filtered to one user of ten returns about a tenth of its
  beam, so for a heavy user it almost always comes up short. A partial index holds only that
  user's rows, so its beam is all theirs. The user id is written into the SQL as a literal: the
  planner can use a partial index only when it can prove the predicate at plan time, which a
  bind parameter of a cached generic plan does not allow;
- **the shared index** — for users without their own, when it can deliver enough rows (a user
  who owns most of the table);
- otherwise **an exact scan in SQL**: the server scores and gates every row of the user and
  returns only the best few (:func:`_recall_exact_top`), which are then re-ranked in Python;
  the margin between what SQL returned and what it left behind is checked, so floating-point
  differences between SQL and Python can never change the result.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Final, Literal

import numpy as np
import psycopg
from psycopg import sql

from yak_pipeline.core.scoring import (
    GATE_EPSILON,
    TIER_GRAVITY,
    RecallCandidate,
    ScoredMemory,
    can_stop_fetching,
    max_gate_distance,
    rank_candidates,
    tier_threshold_multiplier,
)

if TYPE_CHECKING:
    from yak_pipeline.store.hybrid import HybridParams

_MIN_FETCH = 40
# The widest HNSW beam recall asks for; past it an exact scan is the better plan.
MAX_EF_SEARCH: Final[int] = 1000
# A user gets their own partial HNSW index (per table) from this many rows on; below it an
# exact scan of their rows costs a few milliseconds and is exact.
USER_INDEX_MIN_ROWS: Final[int] = 5_000
# The beam is this many times the rows wanted: HNSW's recall of the true top-n at ef = n is
# around 0.95 on 10k rows of 384 dimensions; at 2n it is ≥ 0.99 (measured by the benchmark).
_EF_PER_ROW: Final[float] = 2.0
# The SQL exact scan returns this many rows beyond the limit, so that a row whose SQL score
# and Python score differ in the last bits cannot be lost at the boundary.
_EXACT_MARGIN: Final[int] = 16
# Relative difference allowed between the SQL and the Python evaluation of the same score
# (different multiplication order, libm exp): far above float8 rounding, far below real gaps.
_SCORE_REL_TOLERANCE: Final[float] = 1e-9

RecallTable = Literal["distillations", "memories"]

_CANDIDATE_COLUMNS = "id, 1 - (embedding <=> %(q)s) AS similarity, tier, warmth, user_weight, refreshed_at"
_CANDIDATE_FILTER = "status = 'active' AND deleted_at IS NULL AND embedding_model = %(model)s"
_CANDIDATE_SQL = f"""
    SELECT {_CANDIDATE_COLUMNS}
    FROM distillations
    WHERE user_id = %(user)s AND {_CANDIDATE_FILTER}
"""
# Every row gated and scored by the server; only the best few leave it. OFFSET 0 keeps the
# subquery from being pulled up, which would compute the cosine distance once per reference.
_EXACT_TOP_SQL = f"""
    SELECT id, similarity, tier, warmth, user_weight, refreshed_at, score FROM (
        SELECT *, similarity
                  * CASE WHEN %(decay)s
                         THEN exp(%(rate)s * greatest(extract(epoch FROM %(now)s - refreshed_at)::float8, 0))
                         ELSE 1 END
                  * (1 + warmth)
                  * CASE tier WHEN 'core' THEN %(g_core)s WHEN 'medium' THEN %(g_medium)s ELSE %(g_low)s END
                  * user_weight AS score
        FROM ({_CANDIDATE_SQL} OFFSET 0) scored
        WHERE 1 - similarity <= CASE tier WHEN 'core' THEN %(gate_core)s WHEN 'medium' THEN %(gate_medium)s
                                          ELSE %(gate_low)s END
    ) gated
    ORDER BY score DESC, similarity DESC, id
    LIMIT %(n)s
"""


@dataclass(frozen=True)
class RecallParams:
    """The knobs of one recall (request threshold and limit, plus the configured scoring)."""

    threshold: float = 0.7
    limit: int = 5
    half_life_days: float = 30.0
    decay_enabled: bool = True
    core_multiplier: float = 2.0
    # Set: callers route through hybrid recall (store.hybrid) with these fusion knobs;
    # recall() below is the vector-only path and ignores it.
    hybrid: HybridParams | None = None


def _candidates(rows: Sequence[tuple]) -> list[RecallCandidate]:
    return [
        RecallCandidate(id=str(r[0]), similarity=float(r[1]), tier=r[2], warmth=float(r[3]),
                        user_weight=float(r[4]), refreshed_at=r[5])
        for r in rows
    ]


def _rank(candidates: list[RecallCandidate], params: RecallParams, now: datetime) -> list[ScoredMemory]:
    return rank_candidates(
        candidates, threshold=params.threshold, limit=params.limit, now=now,
        half_life_days=params.half_life_days, decay_enabled=params.decay_enabled,
        core_multiplier=params.core_multiplier,
    )


# --- per-user indexes -----------------------------------------------------------------------------


def user_index_name(table: RecallTable, user_id: str) -> str:
    """The name of ``user_id``'s own HNSW index on ``table`` (a hash: user ids are not identifiers)."""
    digest = hashlib.sha256(user_id.encode()).hexdigest()[:16]
    return f"{table}_hnsw_user_{digest}"


def has_user_index(conn: psycopg.Connection, table: RecallTable, user_id: str) -> bool:
    """Whether ``user_id`` has a valid (fully built) own HNSW index on ``table``.

    A ``CREATE INDEX CONCURRENTLY`` that failed leaves an invalid index behind; the planner
    ignores it, so recall must too.
    """
    row = conn.execute("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)",
                       (user_index_name(table, user_id),)).fetchone()
    return bool(row and row[0])


def ensure_user_indexes(
    conn: psycopg.Connection, *, min_rows: int = USER_INDEX_MIN_ROWS, concurrently: bool = True
) -> list[str]:
    """Give every user with ``min_rows`` embedded rows in a table their own HNSW index there.

    Idempotent and cheap when nothing is to do (one grouped count per table); returns the
    names of the indexes built. ``concurrently`` (the default) builds without blocking writes
    and needs an autocommit connection. Invalid leftovers of an interrupted build are rebuilt;
    indexes of users who fell under half the threshold (forgotten rows) are dropped.
    """
    if concurrently and not conn.autocommit:
        raise ValueError("ensure_user_indexes(concurrently=True) needs an autocommit connection")
    how = sql.SQL("CONCURRENTLY ") if concurrently else sql.SQL("")
    built = []
    for table in ("distillations", "memories"):
        counts = dict(conn.execute(
            sql.SQL("SELECT user_id, count(*) FROM {} WHERE embedding IS NOT NULL AND deleted_at IS NULL "
                    "GROUP BY user_id").format(sql.Identifier(table))).fetchall())
        existing = {
            name: valid for name, valid in conn.execute(
                "SELECT c.relname, i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "WHERE i.indrelid = %s::regclass AND c.relname LIKE %s",
                (table, f"{table}_hnsw_user_%")).fetchall()
        }
        wanted = {user_index_name(table, user): user for user, n in counts.items() if n >= min_rows}
        keep = {user_index_name(table, user) for user, n in counts.items() if n >= min_rows // 2}
        for name, valid in existing.items():
            if name not in keep or (not valid and name in wanted):
                conn.execute(sql.SQL("DROP INDEX {}IF EXISTS {}").format(how, sql.Identifier(name)))
                existing[name] = False
        for name, user in sorted(wanted.items()):
            if existing.get(name):
                continue
            conn.execute(sql.SQL(
                "CREATE INDEX {}IF NOT EXISTS {} ON {} USING hnsw (embedding vector_cosine_ops) WHERE user_id = {}"
            ).format(how, sql.Identifier(name), sql.Identifier(table), sql.Literal(user)))
            built.append(name)
    return built


def set_beam(conn: psycopg.Connection, ef_search: int) -> None:
    """``hnsw.ef_search`` for the rest of this transaction (``set_config(..., true)``)."""
    conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(max(min(ef_search, MAX_EF_SEARCH), 1)),))


def beam_for(rows_wanted: int) -> int:
    """The ``ef_search`` that delivers the true top ``rows_wanted`` of a user's own index reliably."""
    return max(math.ceil(rows_wanted * _EF_PER_ROW), _MIN_FETCH)


# --- recall ---------------------------------------------------------------------------------------


_ITERATIVE_SCAN_SUPPORT: dict[tuple[str, str, str], bool] = {}


def _supports_iterative_scan(conn: psycopg.Connection) -> bool:
    """Whether the server's pgvector (0.8+) can keep scanning HNSW past filtered-out rows."""
    key = (conn.info.host, str(conn.info.port), conn.info.dbname)
    if key not in _ITERATIVE_SCAN_SUPPORT:
        version = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
        parts = tuple(int(p) for p in version[0].split(".")[:2]) if version else (0, 0)
        _ITERATIVE_SCAN_SUPPORT[key] = parts >= (0, 8)
    return _ITERATIVE_SCAN_SUPPORT[key]


def _max_user_weight(conn: psycopg.Connection, user_id: str, embedding_model: str) -> float:
    row = conn.execute(
        f"SELECT max(user_weight) FROM distillations WHERE user_id = %(user)s AND {_CANDIDATE_FILTER}",
        {"user": user_id, "model": embedding_model},
    ).fetchone()
    return float(row[0]) if row and row[0] is not None else 0.0


def recall(
    conn: psycopg.Connection,
    *,
    user_id: str,
    query_embedding: Sequence[float],
    embedding_model: str,
    params: RecallParams = RecallParams(),
    now: datetime | None = None,
) -> list[ScoredMemory]:
    """The user's best ``params.limit`` active distillations for a query embedding, best first."""
    now = now or datetime.now(timezone.utc)
    query = np.asarray(query_embedding, dtype=np.float32)
    if params.limit <= 0:
        return []
    if has_user_index(conn, "distillations", user_id):
        ranked = _recall_from_index(conn, user_id=user_id, query=query, embedding_model=embedding_model,
                                    params=params, now=now, own_index=True, total=None)
    else:
        total = conn.execute(
            f"SELECT count(*) FROM distillations WHERE user_id = %(user)s AND {_CANDIDATE_FILTER}",
            {"user": user_id, "model": embedding_model},
        ).fetchone()[0]
        if total == 0:
            return []
        ranked = _recall_from_index(conn, user_id=user_id, query=query, embedding_model=embedding_model,
                                    params=params, now=now, own_index=False, total=total)
    if ranked is not None:
        return ranked
    return _recall_exact_top(conn, user_id=user_id, query=query, embedding_model=embedding_model,
                             params=params, now=now)


def _recall_from_index(
    conn: psycopg.Connection, *, user_id: str, query: np.ndarray, embedding_model: str, params: RecallParams,
    now: datetime, own_index: bool, total: int | None,
) -> list[ScoredMemory] | None:
    """The threshold algorithm over an HNSW index; None when an exact scan must decide."""
    widest_gate = max_gate_distance(params.threshold, params.core_multiplier)
    iterative = not own_index and _supports_iterative_scan(conn)
    # With the user's own index the user id must be a literal for the planner to use it (see
    # the module docstring); with the shared one it stays a parameter.
    user = sql.Literal(user_id) if own_index else sql.SQL("%(user)s")
    statement = sql.SQL(
        "SELECT " + _CANDIDATE_COLUMNS + " FROM distillations WHERE user_id = {user} AND " + _CANDIDATE_FILTER
        + " ORDER BY embedding <=> %(q)s LIMIT %(n)s"
    ).format(user=user)
    max_weight: float | None = None
    fetch = max(params.limit * 4, _MIN_FETCH)
    while (total is None or fetch < total) and fetch <= MAX_EF_SEARCH:
        # HNSW returns at most ef_search rows; with pgvector 0.8+ relaxed_order lets it keep
        # scanning past rows the user filter discards.
        set_beam(conn, beam_for(fetch) if own_index else fetch)
        if iterative:
            conn.execute("SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true)")
        rows = conn.execute(statement, {"q": query, "user": user_id, "model": embedding_model,
                                        "n": fetch}).fetchall()
        if len(rows) < fetch:
            # The index gave up early (other users' rows filled its beam, or rows it holds are
            # inactive or of another model): score exactly.
            return None
        candidates = _candidates(rows)
        ranked = _rank(candidates, params, now)
        last_similarity = min(c.similarity for c in candidates)
        if 1.0 - last_similarity > widest_gate:
            return ranked  # no row further away can pass even the core gate
        if max_weight is None:
            max_weight = _max_user_weight(conn, user_id, embedding_model)
        if can_stop_fetching(ranked, params.limit, last_similarity, max_weight,
                             threshold=params.threshold, core_multiplier=params.core_multiplier):
            return ranked
        fetch *= 4
    return None


def _recall_exact_top(
    conn: psycopg.Connection, *, user_id: str, query: np.ndarray, embedding_model: str, params: RecallParams,
    now: datetime,
) -> list[ScoredMemory]:
    """Exact recall with the scoring done by the server: only the best rows come back to Python.

    SQL gates (slightly wider than :func:`passes_tier_gate`) and scores every row, returns the
    best ``limit + margin``; Python re-gates and re-scores those with ``rank_candidates``. When
    the rows SQL left out could, within floating-point tolerance, still outscore the limit-th
    row, every row is fetched instead (:func:`recall_exact`).
    """
    gate = (1.0 - params.threshold)
    slack = GATE_EPSILON * 2  # wider than the Python gate; Python has the final word
    n = params.limit + _EXACT_MARGIN
    rows = conn.execute(_EXACT_TOP_SQL, {
        "q": query, "user": user_id, "model": embedding_model, "now": now, "n": n,
        "decay": params.decay_enabled,
        "rate": -math.log(2.0) / (params.half_life_days * 86_400.0) if params.decay_enabled else 0.0,
        "g_core": TIER_GRAVITY["core"], "g_medium": TIER_GRAVITY["medium"], "g_low": TIER_GRAVITY["low"],
        "gate_core": gate * tier_threshold_multiplier("core", params.core_multiplier) + slack,
        "gate_medium": gate * tier_threshold_multiplier("medium", params.core_multiplier) + slack,
        "gate_low": gate * tier_threshold_multiplier("low", params.core_multiplier) + slack,
    }).fetchall()
    ranked = _rank(_candidates(rows), params, now)
    if len(rows) < n:
        return ranked  # every row that passes a gate came back
    left_out_best = float(rows[-1][6])
    bound = left_out_best + _SCORE_REL_TOLERANCE * max(abs(left_out_best), 1.0)
    if len(ranked) >= params.limit and ranked[params.limit - 1].score > bound:
        return ranked
    return recall_exact(conn, user_id=user_id, query_embedding=query, embedding_model=embedding_model,
                        params=params, now=now)


def recall_exact(
    conn: psycopg.Connection,
    *,
    user_id: str,
    query_embedding: Sequence[float],
    embedding_model: str,
    params: RecallParams = RecallParams(),
    now: datetime | None = None,
) -> list[ScoredMemory]:
    """Exact scoring of every candidate row in Python, no index: the reference recall is checked against."""
    now = now or datetime.now(timezone.utc)
    rows = conn.execute(
        _CANDIDATE_SQL,
        {"q": np.asarray(query_embedding, dtype=np.float32), "user": user_id, "model": embedding_model},
    ).fetchall()
    return _rank(_candidates(rows), params, now)
