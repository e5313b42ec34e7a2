"""The recall query (DESIGN §4): ANN candidates, fetched until provably enough, re-ranked exactly.

The HNSW index only proposes candidates in similarity order. Because every multiplier of the
score is bounded (decay ≤ 1, 1 + warmth ≤ 2, gravity ≤ 2 × max user weight), once the k-th
best score so far beats the best score any not-yet-fetched row could reach, fetching stops
(a threshold algorithm); otherwise the fetch size grows. When the user has fewer rows than a
fetch, or the index cannot deliver enough rows, every row is scored exactly instead. The final
order always comes from ``core.scoring.rank_candidates``, the function the tests' reference
ranking uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import numpy as np
import psycopg

from yak_pipeline.core.scoring import (
    RecallCandidate,
    ScoredMemory,
    can_stop_fetching,
    max_gate_distance,
    rank_candidates,
)

if TYPE_CHECKING:
    from yak_pipeline.store.hybrid import HybridParams

_MIN_FETCH = 40
_MAX_EF_SEARCH = 1000
_CANDIDATE_SQL = """
    SELECT id, 1 - (embedding <=> %(q)s) AS similarity, tier, warmth, user_weight, refreshed_at
    FROM distillations
    WHERE user_id = %(user)s AND status = 'active' AND deleted_at IS NULL AND embedding_model = %(model)s
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


_ITERATIVE_SCAN_SUPPORT: dict[tuple[str, str, str], bool] = {}


def _supports_iterative_scan(conn: psycopg.Connection) -> bool:
    """Whether the server's pgvector (0.8+) can keep scanning HNSW past filtered-out rows."""
    key = (conn.info.host, str(conn.info.port), conn.info.dbname)
    if key not in _ITERATIVE_SCAN_SUPPORT:
        version = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
        parts = tuple(int(p) for p in version[0].split(".")[:2]) if version else (0, 0)
        _ITERATIVE_SCAN_SUPPORT[key] = parts >= (0, 8)
    return _ITERATIVE_SCAN_SUPPORT[key]


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
    total, max_weight = conn.execute(
        """SELECT count(*), max(user_weight) FROM distillations
           WHERE user_id = %s AND status = 'active' AND deleted_at IS NULL AND embedding_model = %s""",
        (user_id, embedding_model),
    ).fetchone()
    if total == 0:
        return []
    widest_gate = max_gate_distance(params.threshold, params.core_multiplier)
    iterative = _supports_iterative_scan(conn)
    fetch = max(params.limit * 4, _MIN_FETCH)
    while fetch < total and fetch <= _MAX_EF_SEARCH:
        # HNSW returns at most ef_search rows; with pgvector 0.8+ relaxed_order lets it keep
        # scanning past rows the user filter discards. set_config(..., true) scopes to this transaction.
        conn.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(max(fetch, _MIN_FETCH)),))
        if iterative:
            conn.execute("SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true)")
        rows = conn.execute(
            _CANDIDATE_SQL + " ORDER BY embedding <=> %(q)s LIMIT %(n)s",
            {"q": query, "user": user_id, "model": embedding_model, "n": fetch},
        ).fetchall()
        if len(rows) < fetch:
            break  # the index gave up early (other users' rows filled its beam): score exactly
        candidates = _candidates(rows)
        ranked = _rank(candidates, params, now)
        last_similarity = min(c.similarity for c in candidates)
        if 1.0 - last_similarity > widest_gate:
            return ranked  # no row further away can pass even the core gate
        if can_stop_fetching(ranked, params.limit, last_similarity, float(max_weight)):
            return ranked
        fetch *= 4
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
    """Exact scoring of every candidate row, no index: the reference recall is checked against."""
    now = now or datetime.now(timezone.utc)
    rows = conn.execute(
        _CANDIDATE_SQL,
        {"q": np.asarray(query_embedding, dtype=np.float32), "user": user_id, "model": embedding_model},
    ).fetchall()
    return _rank(_candidates(rows), params, now)
