"""Hybrid recall: words and meaning, over distillations and the exchanges they came from.

One query makes four ranked candidate lists ("legs"), each over the user's rows only:

- **distillation text** — BM25 over ``distillations.content_tsv`` (PostgreSQL full text);
- **distillation vector** — cosine similarity over ``distillations.embedding``;
- **exchange text** — BM25 over ``memories.context_tsv``: each raw exchange together with the
  exchanges just before and after it in the same conversation (sql/006; ``content_tsv``, the
  exchange alone, with ``exchange_context`` off);
- **exchange vector** — cosine similarity over ``memories.embedding``.

What is recalled is still an *active distillation of the active embedding model* (DESIGN §4): an
exchange candidate stands for the distillation it became, following merges to the distillation
that absorbed it; an exchange with no recallable distillation (pending, in review, rejected) is
dropped, so the confidence gate keeps its meaning.

The lists are fused with weighted reciprocal-rank fusion,
``fused = Σ_leg w_leg / (rrf_k + rank_leg)``, normalised so that 1.0 means "first in every leg",
raised to ``relevance_exponent`` (``relevance = fused ** e``: how much the query's evidence
outweighs the priors below), and ranked by the DESIGN §4 score with ``relevance`` in the place of
the similarity:
``relevance × decay × (1 + warmth) × gravity``. The tier-scaled similarity gate decides what
counts as *vector* evidence (a vector candidate enters its leg only when its similarity passes
its tier's gate); a full-text match is evidence in its own right, because the words the query
uses are in the memory.

Why BM25 and not ``ts_rank``: ``ts_rank`` has no inverse document frequency, so in a person's
history, where their own name and "User" are in every row, it ranks by the commonest words.
BM25 here is computed in SQL from the stored ``tsvector``s (term frequency from the positions,
document frequency and average length over the user's rows), with the query's terms OR-ed so a
row need not contain every word of a question.

The vector legs use the user's own partial HNSW index when they have one (heavy users, see
``store.recall.ensure_user_indexes``), else the shared HNSW index when the user has many rows
(with ``ef_search`` raised so enough of the user's rows survive the filter, pgvector 0.6 having
no iterative scan), and scan the user's rows exactly otherwise or when the index comes up short.
:func:`hybrid_recall_exact` scans everything exactly; the benchmark compares the two.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Final, Literal

import numpy as np
import psycopg
from psycopg import sql

from yak_pipeline.core.scoring import (
    RecallCandidate,
    ScoredMemory,
    passes_tier_gate,
    recall_score,
)

from yak_pipeline.store.recall import MAX_EF_SEARCH, beam_for, has_user_index, set_beam

if TYPE_CHECKING:
    from yak_pipeline.store.recall import RecallParams

Leg = Literal["distillation_text", "distillation_vector", "exchange_text", "exchange_vector"]
LEGS: Final[tuple[Leg, ...]] = ("distillation_text", "distillation_vector", "exchange_text", "exchange_vector")

# Okapi BM25's usual constants (Robertson & Zaragoza); not tuned to any data set.
BM25_K1: Final[float] = 1.2
BM25_B: Final[float] = 0.75

# Below this many rows a user's rows are scanned exactly: it is as fast as the index and exact.
EXACT_SCAN_MAX_ROWS: Final[int] = 2_000
# HNSW returns the nearest rows of *all* users; the share that is the user's is estimated, and
# the beam widened by this safety factor so that enough of them survive the user filter.
_EF_SAFETY: Final[float] = 2.0
# Merge chains longer than this are not followed (each merge is one hop).
_MAX_MERGE_HOPS: Final[int] = 8

_TABLES: Final[dict[str, str]] = {
    # Recall candidates are active distillations of the active embedding model (DESIGN §4).
    "distillations": "t.user_id = %(user)s AND t.status = 'active' AND t.deleted_at IS NULL "
                     "AND t.embedding_model = %(model)s",
    # Every live exchange of the user; its distillation is checked when it is mapped.
    "memories": "t.user_id = %(user)s AND t.deleted_at IS NULL",
}

# Term frequencies come from the matched rows only, and from the query's lexemes only: setweight
# marks the query's lexemes with weight A (to_tsvector gives every position the default D) and
# ts_filter keeps just those, so a row unnests its few matching lexemes instead of all of them.
# The OR-ed tsquery and the lexeme array are computed once (the `q` CTE) rather than per row.
_BM25_SQL: Final[str] = """
WITH q AS MATERIALIZED (
    SELECT replace(plainto_tsquery('english', %(text)s)::text, ' & ', ' | ')::tsquery AS query,
           array(SELECT DISTINCT lexeme FROM unnest(to_tsvector('english', %(text)s))) AS lexemes
), corpus AS (
    -- {terms} = length({tsv}) (sql/005, 006): an index-only scan instead of every row.
    SELECT count(*)::float8 AS n, avg(t.{terms})::float8 AS avgdl
    FROM {table} t WHERE {where}
), hits AS (
    SELECT t.id, u.lexeme, greatest(cardinality(u.positions), 1)::float8 AS tf,
           t.{terms}::float8 AS dl
    FROM q, {table} t CROSS JOIN LATERAL unnest(ts_filter(setweight(t.{tsv}, 'A', q.lexemes), '{{a}}')) AS u
    WHERE {where}
      AND t.{tsv} @@ q.query
), df AS (
    SELECT lexeme, count(*)::float8 AS df FROM hits GROUP BY lexeme
)
SELECT h.id,
       sum(ln(1 + (c.n - f.df + 0.5) / (f.df + 0.5))
           * h.tf * (%(k1)s + 1) / (h.tf + %(k1)s * (1 - %(b)s + %(b)s * h.dl / greatest(c.avgdl, 1)))) AS score
FROM hits h JOIN df f USING (lexeme) CROSS JOIN corpus c
GROUP BY h.id
ORDER BY score DESC, h.id
LIMIT %(limit)s
"""


@dataclass(frozen=True)
class HybridParams:
    """The fusion knobs of hybrid recall (``YAK_HYBRID_*`` settings)."""

    # Small, not the usual 60: the fused relevance is multiplied by decay and gravity (a 4×
    # range between tiers), and with k = 60 ranks 1 and 10 differ by only 15 %, so the priors
    # would decide the order alone (measured on LoCoMo: docs/BENCHMARKS.md).
    rrf_k: float = 1.0
    # RRF relevance is raised to this power before the priors multiply it. With 1, a 2x prior
    # (30 days of decay, one tier of gravity) outweighs two or more ranks, so the priors decide
    # the order instead of the query; with 6, a 2x prior is worth 12 % of fused relevance (rank 1
    # and rank 2 of one leg differ by 50 %): relevance first, the priors decide among near-equals
    # (measured on LoCoMo per conversation: docs/BENCHMARKS.md).
    relevance_exponent: float = 6.0
    text_weight: float = 1.0
    vector_weight: float = 1.0
    # The exchange legs count double: the raw words, searched with the conversation around them,
    # hold what a distillation drops (measured on LoCoMo per conversation: docs/BENCHMARKS.md).
    exchange_weight: float = 2.0
    leg_size: int = 50
    # Search each exchange with its neighbours in the conversation (sql/006): a reply such as
    # "yes, it was so powerful!" is found by the words of the question it answers.
    exchange_context: bool = True

    def __post_init__(self) -> None:
        if not self.rrf_k > 0 or math.isinf(self.rrf_k):
            raise ValueError(f"rrf_k must be a positive finite number, got {self.rrf_k!r}")
        if not self.relevance_exponent > 0 or math.isinf(self.relevance_exponent):
            raise ValueError(f"relevance_exponent must be a positive finite number, got {self.relevance_exponent!r}")
        for name in ("text_weight", "vector_weight", "exchange_weight"):
            value = getattr(self, name)
            if not value >= 0 or math.isinf(value):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.leg_size < 1:
            raise ValueError(f"leg_size must be >= 1, got {self.leg_size}")

    def leg_weight(self, leg: Leg) -> float:
        """A leg's weight: text or vector weight, times the exchange weight for exchange legs."""
        kind = self.text_weight if leg.endswith("_text") else self.vector_weight
        return kind * (self.exchange_weight if leg.startswith("exchange") else 1.0)


@dataclass(frozen=True)
class LegHit:
    """One row of one leg: its id and the leg's own score (BM25 or cosine similarity)."""

    id: str
    score: float


@dataclass(frozen=True)
class HybridCandidate:
    """An active distillation that some leg proposed, with what the §4 score needs."""

    id: str
    similarity: float
    tier: str
    warmth: float
    user_weight: float
    refreshed_at: datetime
    ranks: Mapping[Leg, int] = field(default_factory=dict)


@dataclass(frozen=True)
class HybridHit:
    """A recalled distillation: fused relevance, the §4 score, and the rank it had in each leg."""

    id: str
    similarity: float
    relevance: float
    tier: str
    warmth: float
    user_weight: float
    refreshed_at: datetime
    score: float
    ranks: Mapping[Leg, int]

    def as_scored_memory(self) -> ScoredMemory:
        """The hit in the shape the vector-only recall returns (``score`` is the hybrid score)."""
        return ScoredMemory(id=self.id, similarity=self.similarity, tier=self.tier,  # type: ignore[arg-type]
                            warmth=self.warmth, user_weight=self.user_weight, refreshed_at=self.refreshed_at,
                            score=self.score)


# --- the legs -------------------------------------------------------------------------------------


def bm25_search(
    conn: psycopg.Connection,
    *,
    table: Literal["memories", "distillations"],
    user_id: str,
    query: str,
    limit: int,
    embedding_model: str | None = None,
    context: bool = False,
) -> list[LegHit]:
    """The user's rows of ``table`` best matching ``query`` by Okapi BM25 over ``content_tsv``.

    Query words are stemmed and stop words dropped by PostgreSQL's ``english`` configuration;
    any of them may match (OR). ``embedding_model`` is required for distillations (only the
    active model's rows are recall candidates). With ``context`` (memories only) each exchange
    is searched together with its neighbours in the conversation (``context_tsv``, sql/006).
    """
    if table == "distillations" and embedding_model is None:
        raise ValueError("bm25_search over distillations needs the active embedding_model")
    if context and table != "memories":
        raise ValueError("only exchanges (memories) have a conversation context")
    if limit <= 0 or not query.strip():
        return []
    column = "context" if context else "content"
    sql = _BM25_SQL.format(table=table, where=_TABLES[table], tsv=f"{column}_tsv", terms=f"{column}_terms")
    rows = conn.execute(sql, {"text": query, "user": user_id, "model": embedding_model, "limit": limit,
                              "k1": BM25_K1, "b": BM25_B}).fetchall()
    return [LegHit(id=str(r[0]), score=float(r[1])) for r in rows]


def vector_search(
    conn: psycopg.Connection,
    *,
    table: Literal["memories", "distillations"],
    user_id: str,
    query_embedding: Sequence[float],
    embedding_model: str,
    limit: int,
    exact: bool = False,
) -> list[LegHit]:
    """The user's ``limit`` rows of ``table`` most similar to the query (cosine), most similar first.

    With ``exact`` every row of the user is scored; otherwise the HNSW index proposes them when
    that is cheaper, and an exact scan stands in when the index cannot deliver ``limit`` rows.
    """
    if limit <= 0:
        return []
    where = _TABLES[table] + " AND t.embedding IS NOT NULL AND t.embedding_model = %(model)s"
    args = {"q": np.asarray(query_embedding, dtype=np.float32), "user": user_id, "model": embedding_model,
            "n": limit}
    if not exact:
        own_index = has_user_index(conn, table, user_id)
        ef = beam_for(limit) if own_index else _index_beam(conn, table=table, where=where, args=args, limit=limit)
        if ef is not None:
            set_beam(conn, ef)
            # The user's own partial index is usable only when the planner sees the user id as
            # a literal (store.recall explains); the parameter stays for the shared index.
            mine = sql.SQL(" AND t.user_id = {}").format(sql.Literal(user_id)) if own_index else sql.SQL("")
            rows = conn.execute(
                sql.SQL(f"SELECT t.id, 1 - (t.embedding <=> %(q)s) FROM {table} t WHERE {where}{{mine}} "  # noqa: S608
                        "ORDER BY t.embedding <=> %(q)s LIMIT %(n)s").format(mine=mine),
                args,
            ).fetchall()
            if len(rows) >= limit:
                return [LegHit(id=str(r[0]), score=float(r[1])) for r in rows]
    # Ordering by the similarity expression (not by `embedding <=> q`) keeps the planner off the
    # index: this is the exact scan of the user's rows.
    rows = conn.execute(
        f"SELECT t.id, 1 - (t.embedding <=> %(q)s) AS similarity FROM {table} t WHERE {where} "  # noqa: S608
        "ORDER BY similarity DESC, t.id LIMIT %(n)s",
        args,
    ).fetchall()
    return [LegHit(id=str(r[0]), score=float(r[1])) for r in rows]


def _index_beam(conn: psycopg.Connection, *, table: str, where: str, args: dict, limit: int) -> int | None:
    """The HNSW ``ef_search`` to use, or None when an exact scan is the better plan.

    The index is worth it only when the user has many rows; its beam must be wide enough that
    ``limit`` of the user's rows remain after the filter, which depends on the user's share.
    """
    mine = conn.execute(f"SELECT count(*) FROM {table} t WHERE {where}", args).fetchone()[0]  # noqa: S608
    if mine <= max(EXACT_SCAN_MAX_ROWS, limit):
        return None
    # The planner's row estimate is free, and close enough to size a beam.
    estimate = conn.execute("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", (table,)).fetchone()[0]
    total = max(float(estimate), float(mine))
    beam = math.ceil(limit * (total / mine) * _EF_SAFETY)
    if beam > MAX_EF_SEARCH:
        return None
    return max(beam, 40)


# --- from exchanges to distillations --------------------------------------------------------------


def recallable_distillations(
    conn: psycopg.Connection, *, user_id: str, memory_ids: Iterable[str], embedding_model: str
) -> dict[str, str]:
    """For each memory, the active distillation of the active model that now holds what it said.

    That is the memory's own distillation when active, or — when it was merged — the distillation
    it was merged into (following further merges). Memories with none are left out.
    """
    wanted = list(dict.fromkeys(memory_ids))
    if not wanted:
        return {}
    rows = conn.execute(
        """SELECT memory_id, id, status, embedding_model FROM distillations
           WHERE user_id = %s AND memory_id = ANY(%s::uuid[]) AND deleted_at IS NULL
             AND status IN ('active', 'merged')
           ORDER BY created_at, id""",
        (user_id, wanted),
    ).fetchall()
    result: dict[str, str] = {}
    # memory id -> the merged distillation it is waiting to resolve
    following: dict[str, str] = {}
    for memory_id, distillation_id, status, model in rows:
        memory_id, distillation_id = str(memory_id), str(distillation_id)
        if memory_id in result:
            continue
        if status == "active":
            if model == embedding_model:
                result[memory_id] = distillation_id
                following.pop(memory_id, None)
        else:
            following.setdefault(memory_id, distillation_id)
    for _ in range(_MAX_MERGE_HOPS):
        if not following:
            break
        merged_ids = list(set(following.values()))
        targets = conn.execute(
            """SELECT DISTINCT ON (m.merged) m.merged, d.id, d.status, d.embedding_model
               FROM unnest(%s::uuid[]) AS m(merged)
               JOIN distillation_versions v ON v.merged_from @> ARRAY[m.merged] AND v.deleted_at IS NULL
               JOIN distillations d ON d.id = v.distillation_id AND d.deleted_at IS NULL AND d.user_id = %s
               ORDER BY m.merged, v.created_at DESC""",
            (merged_ids, user_id),
        ).fetchall()
        target_of = {str(r[0]): (str(r[1]), r[2], r[3]) for r in targets}
        still: dict[str, str] = {}
        for memory_id, merged in following.items():
            target = target_of.get(merged)
            if target is None:
                continue
            target_id, status, model = target
            if status == "active" and model == embedding_model:
                result[memory_id] = target_id
            elif status == "merged":
                still[memory_id] = target_id
        following = still
    return result


def source_memories(conn: psycopg.Connection, *, distillation_ids: Iterable[str]) -> dict[str, set[str]]:
    """For each distillation, the memories whose content it holds: its own and every merged one's."""
    wanted = list(dict.fromkeys(distillation_ids))
    if not wanted:
        return {}
    rows = conn.execute(
        """WITH RECURSIVE held(root, distillation_id, depth) AS (
               SELECT d.id, d.id, 0 FROM distillations d WHERE d.id = ANY(%s::uuid[])
               UNION
               SELECT h.root, merged.id, h.depth + 1
               FROM held h
               JOIN distillation_versions v ON v.distillation_id = h.distillation_id AND v.deleted_at IS NULL
               CROSS JOIN LATERAL unnest(v.merged_from) AS merged(id)
               WHERE h.depth < %s
           )
           SELECT h.root, d.memory_id FROM held h JOIN distillations d ON d.id = h.distillation_id""",
        (wanted, _MAX_MERGE_HOPS),
    ).fetchall()
    result: dict[str, set[str]] = {d: set() for d in wanted}
    for root, memory_id in rows:
        result[str(root)].add(str(memory_id))
    return result


# --- fusion ---------------------------------------------------------------------------------------


def fuse(candidates: Iterable[HybridCandidate], params: RecallParams, hybrid: HybridParams,
         now: datetime) -> list[HybridHit]:
    """Rank candidates by weighted RRF relevance times decay, warmth and gravity; the best ``limit``.

    Pure: the SQL legs only supply ranks. Ties break on relevance, then similarity, then id, so
    the order is stable.
    """
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be timezone-aware")
    best_possible = sum(hybrid.leg_weight(leg) for leg in LEGS) / (hybrid.rrf_k + 1)
    hits: list[HybridHit] = []
    for candidate in candidates:
        if not candidate.ranks:
            continue
        fused = sum(hybrid.leg_weight(leg) / (hybrid.rrf_k + rank) for leg, rank in candidate.ranks.items())
        relevance = (fused / best_possible) ** hybrid.relevance_exponent if best_possible > 0 else 0.0
        age_days = (now - candidate.refreshed_at).total_seconds() / 86_400.0
        score = recall_score(relevance, age_days=age_days, warmth=candidate.warmth,
                             tier=candidate.tier, user_weight=candidate.user_weight,  # type: ignore[arg-type]
                             half_life_days=params.half_life_days, decay_enabled=params.decay_enabled)
        hits.append(HybridHit(id=candidate.id, similarity=candidate.similarity, relevance=relevance,
                              tier=candidate.tier, warmth=candidate.warmth, user_weight=candidate.user_weight,
                              refreshed_at=candidate.refreshed_at, score=score, ranks=dict(candidate.ranks)))
    hits.sort(key=lambda h: (-h.score, -h.relevance, -h.similarity, h.id))
    return hits[:params.limit]


def _rank_leg(ids: Iterable[str]) -> dict[str, int]:
    """1-based ranks of ids in order, keeping each id's first (best) position."""
    ranks: dict[str, int] = {}
    for distillation_id in ids:
        if distillation_id not in ranks:
            ranks[distillation_id] = len(ranks) + 1
    return ranks


def active_distillation_ids(conn: psycopg.Connection, *, user_id: str, embedding_model: str) -> list[str]:
    """Every recall candidate of the user: active distillations of the active model."""
    rows = conn.execute(
        """SELECT id FROM distillations
           WHERE user_id = %s AND status = 'active' AND deleted_at IS NULL AND embedding_model = %s""",
        (user_id, embedding_model),
    ).fetchall()
    return [str(r[0]) for r in rows]


def _candidate_rows(conn: psycopg.Connection, *, ids: Sequence[str], query: np.ndarray,
                    embedding_model: str) -> dict[str, RecallCandidate]:
    rows = conn.execute(
        """SELECT id, 1 - (embedding <=> %s) AS similarity, tier, warmth, user_weight, refreshed_at
           FROM distillations
           WHERE id = ANY(%s::uuid[]) AND status = 'active' AND deleted_at IS NULL AND embedding_model = %s""",
        (query, list(ids), embedding_model),
    ).fetchall()
    return {
        str(r[0]): RecallCandidate(id=str(r[0]), similarity=float(r[1]), tier=r[2], warmth=float(r[3]),
                                   user_weight=float(r[4]), refreshed_at=r[5])
        for r in rows
    }


def hybrid_candidates(
    conn: psycopg.Connection,
    *,
    user_id: str,
    query: str,
    query_embedding: Sequence[float],
    embedding_model: str,
    params: RecallParams,
    hybrid: HybridParams,
    exact: bool = False,
) -> list[HybridCandidate]:
    """Run the four legs and gather, per active distillation, its rank in each leg it is in."""
    vector = np.asarray(query_embedding, dtype=np.float32)
    size = hybrid.leg_size
    d_text = bm25_search(conn, table="distillations", user_id=user_id, query=query, limit=size,
                         embedding_model=embedding_model)
    d_vec = vector_search(conn, table="distillations", user_id=user_id, query_embedding=vector,
                          embedding_model=embedding_model, limit=size, exact=exact)
    m_text = bm25_search(conn, table="memories", user_id=user_id, query=query, limit=size,
                         context=hybrid.exchange_context)
    m_vec = vector_search(conn, table="memories", user_id=user_id, query_embedding=vector,
                          embedding_model=embedding_model, limit=size, exact=exact)
    held_by = recallable_distillations(conn, user_id=user_id, memory_ids=[h.id for h in m_text + m_vec],
                                       embedding_model=embedding_model)
    ids = {h.id for h in d_text + d_vec} | set(held_by.values())
    rows = _candidate_rows(conn, ids=sorted(ids), query=vector, embedding_model=embedding_model)

    def gated(hits: Iterable[LegHit], to_distillation: Mapping[str, str] | None) -> list[str]:
        # Vector evidence counts only when the similarity passes the candidate's tier gate.
        kept = []
        for hit in hits:
            target = to_distillation.get(hit.id) if to_distillation is not None else hit.id
            row = rows.get(target) if target is not None else None
            if row is not None and passes_tier_gate(hit.score, params.threshold, row.tier, params.core_multiplier):
                kept.append(target)
        return kept

    legs: dict[Leg, dict[str, int]] = {
        "distillation_text": _rank_leg(h.id for h in d_text if h.id in rows),
        "distillation_vector": _rank_leg(gated(d_vec, None)),
        "exchange_text": _rank_leg(held_by[h.id] for h in m_text if held_by.get(h.id) in rows),
        "exchange_vector": _rank_leg(gated(m_vec, held_by)),
    }
    candidates = []
    for distillation_id, row in rows.items():
        ranks = {leg: ranked[distillation_id] for leg, ranked in legs.items()
                 if distillation_id in ranked and hybrid.leg_weight(leg) > 0}
        if ranks:
            candidates.append(HybridCandidate(id=row.id, similarity=row.similarity, tier=row.tier,
                                              warmth=row.warmth, user_weight=row.user_weight,
                                              refreshed_at=row.refreshed_at, ranks=ranks))
    return candidates


def hybrid_recall(
    conn: psycopg.Connection,
    *,
    user_id: str,
    query: str,
    query_embedding: Sequence[float],
    embedding_model: str,
    params: RecallParams,
    hybrid: HybridParams = HybridParams(),
    now: datetime | None = None,
) -> list[HybridHit]:
    """The user's best ``params.limit`` active distillations for ``query`` by hybrid search, best first."""
    now = now or datetime.now(timezone.utc)
    candidates = hybrid_candidates(conn, user_id=user_id, query=query, query_embedding=query_embedding,
                                   embedding_model=embedding_model, params=params, hybrid=hybrid)
    return fuse(candidates, params, hybrid, now)


def hybrid_recall_exact(
    conn: psycopg.Connection,
    *,
    user_id: str,
    query: str,
    query_embedding: Sequence[float],
    embedding_model: str,
    params: RecallParams,
    hybrid: HybridParams = HybridParams(),
    now: datetime | None = None,
) -> list[HybridHit]:
    """:func:`hybrid_recall` with every vector leg an exact scan: the reference it is checked against."""
    now = now or datetime.now(timezone.utc)
    candidates = hybrid_candidates(conn, user_id=user_id, query=query, query_embedding=query_embedding,
                                   embedding_model=embedding_model, params=params, hybrid=hybrid, exact=True)
    return fuse(candidates, params, hybrid, now)


# --- exchange vectors -----------------------------------------------------------------------------


def exchanges_without_embedding(conn: psycopg.Connection, *, embedding_model: str, user_id: str | None = None,
                                limit: int = 256) -> list[tuple[str, str]]:
    """Up to ``limit`` live exchanges with no vector of ``embedding_model``: (id, content), locked.

    ``FOR UPDATE SKIP LOCKED`` lets several workers fill vectors at once without doing the same row twice.
    """
    rows = conn.execute(
        """SELECT id, content FROM memories
           WHERE deleted_at IS NULL AND (%(user)s::text IS NULL OR user_id = %(user)s)
             AND (embedding IS NULL OR embedding_model IS DISTINCT FROM %(model)s)
           ORDER BY occurred_at, id
           LIMIT %(limit)s
           FOR UPDATE SKIP LOCKED""",
        {"user": user_id, "model": embedding_model, "limit": limit},
    ).fetchall()
    return [(str(r[0]), r[1]) for r in rows]


def set_exchange_embeddings(conn: psycopg.Connection, *, embedding_model: str,
                            vectors: Mapping[str, Sequence[float]]) -> int:
    """Store each exchange's vector (by memory id) with the model that made it; returns rows updated."""
    if not vectors:
        return 0
    with conn.cursor() as cur:
        cur.executemany(
            "UPDATE memories SET embedding = %s, embedding_model = %s WHERE id = %s",
            [(np.asarray(v, dtype=np.float32), embedding_model, memory_id) for memory_id, v in vectors.items()],
        )
    return len(vectors)
