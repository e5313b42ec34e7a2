"""Recall's candidates: every leg's query, in one place (DESIGN §4, docs/RECALL.md).

One query makes five ranked candidate lists ("legs"), each over the user's rows only:

- **distillation text** — BM25 over ``distillations.content_tsv`` (PostgreSQL full text);
- **distillation vector** — cosine similarity over ``distillations.embedding``;
- **exchange text** — BM25 over ``memories.context_tsv``: each raw exchange together with the
  exchanges just before and after it in the same conversation (sql/006; ``content_tsv``, the
  exchange alone, with ``exchange_context`` off);
- **exchange vector** — cosine similarity over ``memories.embedding``;
- **context vector** — cosine similarity over ``memories.context_embedding``: each exchange
  read with its neighbours in the conversation (sql/008; off with ``exchange_context``, and as
  of a past moment, since a context can hold later words).

What is recalled is of two kinds (``core.recall.MemoryKind``). An *active distillation of the
active embedding model*: an exchange candidate stands for the distillation it became, following
merges to the distillation that absorbed it. And the user's own words: an exchange that no
active distillation holds (pending, in review, rejected by the confidence gate, failed, never
distilled) is a candidate of its own, ``kind="raw"``, its id the exchange's. The raw layer is
the floor of recall (DESIGN §4): what was said is recallable as soon as it is stored, by its
words at once and by its meaning once it has a vector; the confidence gate still keeps a
low-confidence *distillation* out, never the words it came from. For the union of the legs' rows,
:func:`recall_candidates` reads what the relevance model needs (both cosines, both BM25 scores,
the best of each leg) and what the score needs (tier, warmth, weight, age, supersession); there
is no similarity pre-gate here. Relevance, the gate and the order are ``core.recall``'s:
:func:`recall` is ``core.recall.rank_memories`` over these candidates.

Why BM25 and not ``ts_rank``: ``ts_rank`` has no inverse document frequency, so in a person's
history, where their own name and "User" are in every row, it ranks by the commonest words.
BM25 here is computed from the stored ``tsvector``s (term frequency from the positions,
document frequency and average length over the user's rows), with the query's terms OR-ed so a
row need not contain every word of a question. Computed from the rows, that opens every row a
common word matches (and its out-of-line tsvector), so recall's two default text legs read
postings (user, word, row, term frequency, length) that triggers keep (sql/013), from index
entries alone, and the counts BM25 needs (each word's rows, the user's rows and their mean
length) from statistics the same triggers append to (sql/014); the computation from the rows
stays as ``exact=True``, the reference.

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

import functools
import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Generic, Literal, NotRequired, TypedDict, TypeVar, Unpack

import numpy as np
import psycopg
from psycopg import sql

from yak_pipeline.core.exchanges import same_words, users_words
from yak_pipeline.core.query_intent import asks_about_present
from yak_pipeline.core.recall import Candidate, Leg, RankedMemory, RecallParams, rank_memories
from yak_pipeline.core.relevance import RelevanceModel, RelevanceSignals
from yak_pipeline.store.rows import uuid_array
from yak_pipeline.store.user_indexes import USER_INDEX_MIN_ROWS, user_indexes

logger = logging.getLogger("yak.recall")

T = TypeVar("T")

_MIN_FETCH: Final[int] = 40
# The widest HNSW beam recall asks for; past it an exact scan is the better plan.
MAX_EF_SEARCH: Final[int] = 1000
# The beam is this many times the rows wanted. On a user's own index (pgvector 0.6), 2n gave
# >= 0.99 of the true top-n on 10k rows of 384 dimensions; on the shared index read with the
# iterative scan, 2n gave a top-10 equal to the exact one for 0.985 of the queries at 100k rows
# of ten users (docs/BENCHMARKS.md §2c): the beam's candidates are shared with other users' rows.
_EF_PER_ROW: Final[float] = 4.0
# Okapi BM25's usual constants (Robertson & Zaragoza); not tuned to any data set.
BM25_K1: Final[float] = 1.2
BM25_B: Final[float] = 0.75
# Below this many rows a user's rows are scanned exactly: it is as fast as the index and exact. From
# it on a user gets their own indexes (store.user_indexes): one line for both.
EXACT_SCAN_MAX_ROWS: Final[int] = USER_INDEX_MIN_ROWS
# Merge chains longer than this are not followed (each merge is one hop).
_MAX_MERGE_HOPS: Final[int] = 8

# ``as_of`` (recall as of a date) keeps only what had happened by then: an exchange by when it
# occurred, a distillation by its source exchange's time.
_TABLES: Final[dict[str, str]] = {
    # Recall candidates are active distillations of the active embedding model (DESIGN §4).
    "distillations": "t.user_id = %(user)s AND t.status = 'active' AND t.deleted_at IS NULL "
                     "AND t.embedding_model = %(model)s AND (%(as_of)s::timestamptz IS NULL OR EXISTS ("
                     "SELECT 1 FROM memories m WHERE m.id = t.memory_id AND m.occurred_at <= %(as_of)s))",
    # Every live exchange of the user; its distillation is checked when it is mapped.
    "memories": "t.user_id = %(user)s AND t.deleted_at IS NULL "
                "AND (%(as_of)s::timestamptz IS NULL OR t.occurred_at <= %(as_of)s)",
}

# Okapi BM25 over the query's `hits` (id, lexeme, tf, dl) in the user's `corpus` (n, avgdl): each
# word's document frequency is the number of its hits. The tail of the BM25 query from the rows
# below (it closes its `hits` CTE).
_BM25_SCORES_SQL: Final[str] = """), df AS (
    SELECT lexeme, count(*)::float8 AS df FROM hits GROUP BY lexeme
)
SELECT h.id::text,
       sum(ln(1 + (c.n - f.df + 0.5) / (f.df + 0.5))
           * h.tf * (%(k1)s + 1) / (h.tf + %(k1)s * (1 - %(b)s + %(b)s * h.dl / greatest(c.avgdl, 1)))) AS score
FROM hits h JOIN df f USING (lexeme) CROSS JOIN corpus c
GROUP BY h.id
ORDER BY score DESC, h.id
LIMIT %(limit)s
"""

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
""" + _BM25_SCORES_SQL



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
    conn.execute("SELECT set_config('hnsw.ef_search', %s, true), set_config('hnsw.iterative_scan', %s, true)",
                 (str(max(min(ef_search, MAX_EF_SEARCH), 1)), "strict_order" if iterative else "off"))


def beam_for(rows_wanted: int) -> int:
    """The ``ef_search`` that delivers the true top ``rows_wanted`` of a user's rows reliably."""
    return max(math.ceil(rows_wanted * _EF_PER_ROW), _MIN_FETCH)


# --- the legs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LegHit:
    """One row of one leg: its id and the leg's own score (BM25 or cosine similarity)."""

    id: str
    score: float


def bm25_search(
    conn: psycopg.Connection,
    *,
    table: Literal["memories", "distillations"],
    user_id: str,
    query: str,
    limit: int,
    embedding_model: str | None = None,
    context: bool = False,
    as_of: datetime | None = None,
    exact: bool = False,
) -> list[LegHit]:
    """The user's rows of ``table`` best matching ``query`` by Okapi BM25 over ``content_tsv``.

    Query words are stemmed and stop words dropped by PostgreSQL's ``english`` configuration;
    any of them may match (OR). ``embedding_model`` is required for distillations (only the
    active model's rows are recall candidates). With ``context`` (memories only) each exchange
    is searched together with its neighbours in the conversation (``context_tsv``, sql/006).

    Recall's two default legs (distillations, and exchanges in context, at the present moment)
    read trigger-kept postings and statistics (sql/013, 014) by index-only scans; ``exact``, and the
    other legs, compute everything from the matching rows: the same top ``limit``, the reference
    the tests compare the postings with.
    """
    if table == "distillations" and embedding_model is None:
        raise ValueError("bm25_search over distillations needs the active embedding_model")
    if context and table != "memories":
        raise ValueError("only exchanges (memories) have a conversation context")
    if limit <= 0 or not query.strip():
        return []
    column = "context" if context else "content"
    if not exact and as_of is None and (table == "distillations" or context):
        leg, scope = ("distillations", embedding_model) if table == "distillations" else ("contexts", "")
        return _bm25_from_postings(conn, leg=leg, user_id=user_id, scope=str(scope), query=query, limit=limit)
    statement = _BM25_SQL.format(table=table, where=_TABLES[table], tsv=f"{column}_tsv", terms=f"{column}_terms")
    rows = conn.execute(statement, {"text": query, "user": user_id, "model": embedding_model, "limit": limit,
                                    "k1": BM25_K1, "b": BM25_B, "as_of": as_of}).fetchall()
    return [LegHit(id=str(r[0]), score=float(r[1])) for r in rows]


# BM25 of one leg of one user from its postings (sql/013) and statistics (sql/014): the same
# formula as _BM25_SQL, with the corpus size and mean length, and each word's document frequency,
# summed from the statistics' deltas instead of counted from the rows and the postings. The mean
# length is numeric sum / count, as avg() computes it, so the scores are the rows' but for the order
# of each row's sum (the last bits). The postings are read once per word of the query, by the join
# alone: a second condition on the words (`lexeme = ANY(...)`) made the planner expect one posting,
# sort the few thousand by row and aggregate them in order, where it now hashes them (the contexts
# leg at 100,000 rows, 100 questions: 4.92 -> 3.80 ms p50, 13.31 -> 9.68 p95).
_BM25_POSTINGS_SQL: Final[str] = """
WITH corpus AS MATERIALIZED (
    SELECT sum(s.df)::float8 AS n, (sum(s.dl_sum)::numeric / nullif(sum(s.dl_rows), 0))::float8 AS avgdl
    FROM bm25_statistics s
    WHERE s.leg = %(leg)s AND s.user_id = %(user)s AND s.scope = %(scope)s AND s.lexeme = ''
), df AS MATERIALIZED (
    SELECT s.lexeme, sum(s.df)::float8 AS df
    FROM bm25_statistics s
    WHERE s.leg = %(leg)s AND s.user_id = %(user)s AND s.scope = %(scope)s
      AND s.lexeme = ANY(array(SELECT DISTINCT lexeme FROM unnest(to_tsvector('english', %(text)s))))
    GROUP BY s.lexeme
    HAVING sum(s.df) > 0
)
SELECT p.row_id::text,
       sum(ln(1 + (c.n - f.df + 0.5) / (f.df + 0.5))
           * p.tf * (%(k1)s + 1) / (p.tf + %(k1)s * (1 - %(b)s + %(b)s * p.dl / greatest(c.avgdl, 1)))) AS score
FROM bm25_postings p JOIN df f ON f.lexeme = p.lexeme CROSS JOIN corpus c
WHERE p.leg = %(leg)s AND p.user_id = %(user)s AND p.scope = %(scope)s
GROUP BY p.row_id
ORDER BY score DESC, p.row_id
LIMIT %(limit)s
"""


def _bm25_from_postings(conn: psycopg.Connection, *, leg: str, user_id: str, scope: str, query: str,
                        limit: int) -> list[LegHit]:
    """Top ``limit`` by BM25 from the postings: equal to the computation from the rows, no row opened."""
    rows = conn.execute(_BM25_POSTINGS_SQL, {"leg": leg, "user": user_id, "scope": scope, "text": query,
                                             "limit": limit, "k1": BM25_K1, "b": BM25_B}).fetchall()
    return [LegHit(id=str(r[0]), score=float(r[1])) for r in rows]


def fold_bm25_statistics(conn: psycopg.Connection) -> int:
    """Sum each (leg, user, scope, word)'s statistics deltas into one row (sql/014); the rows removed.

    A reader's BM25 is the same folded or not; folded, it sums one row per word instead of one per
    write that touched it.
    """
    return int(conn.execute("SELECT yak_bm25_fold_statistics()").fetchone()[0])


def vector_search(
    conn: psycopg.Connection,
    *,
    table: Literal["memories", "distillations"],
    user_id: str,
    query_embedding: Sequence[float],
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
    where = _TABLES[table] + f" AND t.{column} IS NOT NULL AND t.{column}_model = %(model)s"
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


def _has_more_rows_than(conn: psycopg.Connection, *, table: str, where: str, args: dict, rows: int) -> bool:
    """Whether the user has more than ``rows`` candidate rows: reads at most ``rows + 1`` of them.

    A full count of a heavy user's rows cost 21 ms p50 at 10,000 rows, more than the index
    scan it decides about (docs/BENCHMARKS.md); this bounded one reads what the decision needs.
    """
    found = conn.execute(f"SELECT count(*) FROM (SELECT 1 FROM {table} t WHERE {where} LIMIT %(cap)s) AS f",  # noqa: S608
                         {**args, "cap": rows + 1}).fetchone()[0]
    return found > rows


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
    # Each memory's distillations by their memory index, then the user checked on those rows: given
    # `user_id = ` as an index condition, the planner also read the user's every entry in another
    # index and intersected the two (10,000 entries: 2.4 ms of 3.6 at 100,000 rows).
    rows = conn.execute(
        """SELECT d.memory_id::text, d.id::text, d.status, d.embedding_model
           FROM unnest(%s::uuid[]) AS wanted(memory_id)
           JOIN distillations d ON d.memory_id = wanted.memory_id
           WHERE d.user_id = %s AND d.deleted_at IS NULL AND d.status IN ('active', 'merged')
           ORDER BY d.created_at, d.id""",
        (uuid_array(wanted), user_id),
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
            """SELECT DISTINCT ON (m.merged) m.merged::text, d.id::text, d.status, d.embedding_model
               FROM unnest(%s::uuid[]) AS m(merged)
               JOIN distillation_versions v ON v.merged_from @> ARRAY[m.merged] AND v.deleted_at IS NULL
               JOIN distillations d ON d.id = v.distillation_id AND d.deleted_at IS NULL AND d.user_id = %s
               ORDER BY m.merged, v.created_at DESC""",
            (uuid_array(merged_ids), user_id),
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


# --- candidates and recall -----------------------------------------------------------------------

# Ids come back as text throughout recall: a uuid object per row (about a thousand per recall),
# made and then turned into a string, cost 1.5 ms of Python CPU per recall at 100,000 rows.
# Per candidate: the score's inputs, the cosine to the distillation, to its own exchange and to
# that exchange in its context (when ``context``), and the newer memory that replaced it (only
# if that one had happened by ``as_of``).
_CANDIDATE_ROWS_SQL: Final[str] = """
SELECT d.id::text, d.tier, d.warmth, d.user_weight, d.refreshed_at,
       1 - (d.embedding <=> %(q)s) AS cos_distillation,
       CASE WHEN m.embedding_model = %(model)s THEN 1 - (m.embedding <=> %(q)s) END AS cos_exchange,
       CASE WHEN %(as_of)s::timestamptz IS NULL OR sm.occurred_at <= %(as_of)s THEN s.id::text END AS superseded_by,
       CASE WHEN %(context)s AND m.context_embedding_model = %(model)s
            THEN 1 - (m.context_embedding <=> %(q)s) END AS cos_context
FROM distillations d
JOIN memories m ON m.id = d.memory_id
LEFT JOIN distillations s ON s.id = d.superseded_by AND s.status = 'active' AND s.deleted_at IS NULL
LEFT JOIN memories sm ON sm.id = s.memory_id
WHERE d.id = ANY(%(ids)s::uuid[]) AND d.user_id = %(user)s AND d.status = 'active' AND d.deleted_at IS NULL
  AND d.embedding_model = %(model)s AND (%(as_of)s::timestamptz IS NULL OR m.occurred_at <= %(as_of)s)
"""


# Per raw candidate (an exchange no active distillation holds): its time and its cosines (its own
# vector's, and its context's when ``context``); None until the vector of the active model exists.
_RAW_ROWS_SQL: Final[str] = """
SELECT m.id::text, m.occurred_at, m.content,
       CASE WHEN m.embedding_model = %(model)s THEN 1 - (m.embedding <=> %(q)s) END AS cos_exchange,
       CASE WHEN %(context)s AND m.context_embedding_model = %(model)s
            THEN 1 - (m.context_embedding <=> %(q)s) END AS cos_context
FROM memories m
WHERE m.id = ANY(%(ids)s::uuid[]) AND m.user_id = %(user)s AND m.deleted_at IS NULL
  AND (%(as_of)s::timestamptz IS NULL OR m.occurred_at <= %(as_of)s)
"""
# What a raw exchange is scored as: no tier, warmth or weight of its own yet (a distillation
# brings them), so the defaults a new distillation starts with (DESIGN §3).
RAW_TIER: Final = "medium"
RAW_WARMTH: Final[float] = 0.5
RAW_USER_WEIGHT: Final[float] = 1.0
# The cosine an exchange not yet embedded is read with when no candidate of the query has one
# either (a bulk import's first seconds): only its words brought it, and a typical question
# scores its answer 0.3-0.55 with all-MiniLM-L6-v2 (docs/RECALL.md). With any cosine known, the
# best known one stands in instead (its words made it a candidate as the best did by meaning).
UNKNOWN_COSINE: Final[float] = 0.5


def _best_per_distillation(hits: Iterable[LegHit], held_by: Mapping[str, str]) -> dict[str, float]:
    """The best score of an exchange leg for each distillation holding one of its exchanges."""
    best: dict[str, float] = {}
    for hit in hits:
        target = held_by.get(hit.id)
        if target is not None:
            best[target] = max(best.get(target, hit.score), hit.score)
    return best


# Threads that run recall's legs on spare connections (the caller's thread runs them on its own).
# The legs wait on PostgreSQL, not on Python: the threads only hold a connection each.
_LEG_THREADS: Final[ThreadPoolExecutor] = ThreadPoolExecutor(max_workers=8, thread_name_prefix="yak-recall-leg")

# A connection for one helper thread's legs: one the caller holds, or a call that lends one for
# as long as the helper runs legs (None when there is none free: ``Database.idle_connection``).
Spare = psycopg.Connection | Callable[[], AbstractContextManager[psycopg.Connection | None]]


class _Legs(Generic[T]):
    """One recall's legs, taken one at a time by the threads that run them, and their results."""

    def __init__(self, legs: Sequence[Callable[[psycopg.Connection], T]]) -> None:
        self._legs = legs
        self._taken = 0
        self._running = 0
        self._results: list[T | None] = [None] * len(legs)
        self._error: BaseException | None = None
        self._changed = threading.Condition()

    def run_on(self, conn: psycopg.Connection) -> None:
        """Run the next leg not yet taken on ``conn``, until none is left (or one failed)."""
        while True:
            with self._changed:
                if self._error is not None or self._taken == len(self._legs):
                    return
                index, self._taken, self._running = self._taken, self._taken + 1, self._running + 1
            try:
                value = self._legs[index](conn)
            except BaseException as exc:
                with self._changed:
                    self._error = self._error or exc
                    self._running -= 1
                    self._changed.notify_all()
                return
            with self._changed:
                self._results[index] = value
                self._running -= 1
                self._changed.notify_all()

    def results(self) -> list[T]:
        """Every leg's result in order, once no leg is running and none is left; raises what a leg raised."""
        with self._changed:
            self._changed.wait_for(lambda: self._running == 0
                                   and (self._error is not None or self._taken == len(self._legs)))
        if self._error is not None:
            raise self._error
        return self._results  # type: ignore[return-value] - every slot is filled when none failed


def _help(legs: _Legs, spare: Spare) -> None:
    """A helper thread: borrow the spare connection, run legs on it, give it back."""
    with nullcontext(spare) if isinstance(spare, psycopg.Connection) else spare() as conn:
        if conn is not None:
            legs.run_on(conn)


def _log_helper_failure(done: Future) -> None:
    # A helper's legs report their own errors; what is left is borrowing or giving back its
    # connection (the pool replaces a broken one), which no recall waits for.
    if not done.cancelled() and done.exception() is not None:
        logger.warning("a recall helper could not borrow or give back its connection: %s", done.exception())


def _run_legs(conn: psycopg.Connection, legs: Sequence[Callable[[psycopg.Connection], T]],
              spare: Sequence[Spare] = ()) -> list[T]:
    """Each leg's result, in order: one after another on ``conn``, or side by side with helper threads
    on ``spare`` connections, each thread taking the next leg not yet started until none is left.

    Each leg is one query that PostgreSQL runs on one core; side by side they use the others
    (docs/BENCHMARKS.md: the five legs at 100,000 rows, p50 78 → 48 ms on 2 cores). A helper
    borrows its connection itself, while the caller's thread runs the first leg, and gives it
    back (a commit) after the last leg it ran has reported: neither waits in the recall.
    """
    if not spare:
        return [leg(conn) for leg in legs]
    shared = _Legs(legs)
    helpers = [_LEG_THREADS.submit(_help, shared, s) for s in spare]
    for helper in helpers:
        helper.add_done_callback(_log_helper_failure)
    shared.run_on(conn)
    for helper in helpers:
        # One still queued (the threads busy with other recalls) has nothing left to do.
        helper.cancel()
    # Every leg taken has reported: a helper may still be giving its connection back.
    return shared.results()


# One leg of recall: its query on the connection it is given.
_Leg = Callable[[psycopg.Connection], list[LegHit]]


class _Once(Generic[T]):
    """A value computed on the connection of whichever leg asks first; the others wait for it."""

    def __init__(self, compute: Callable[[psycopg.Connection], T]) -> None:
        self._compute = compute
        self._lock = threading.Lock()
        self._done: list[T] = []

    def __call__(self, conn: psycopg.Connection) -> T:
        with self._lock:
            if not self._done:
                self._done.append(self._compute(conn))
            return self._done[0]


class CandidateQuery(TypedDict):
    """What the candidate legs are asked: a user's query, its vector, and how to search.

    ``query_embedding`` is the query's vector, or a call that returns it (a ``Future``'s
    ``result``, the vector still being computed): the text legs need no vector and start at once,
    the vector legs wait for it. ``exact`` scans the vector legs exactly (the reference); ``as_of``
    sees only what had happened by then. With ``spare`` connections — held ones, or calls that lend
    one (``Database.idle_connection``) — the legs run side by side, on the request's connection
    and on them (:func:`_run_legs`). ``echo`` is the message being answered when it is not
    ``query`` itself (the proxy's follow-up, read after the message before it): an exchange that
    says just that is an earlier asking of the same question, not evidence (default: ``query``).
    """

    user_id: str
    query: str
    query_embedding: Sequence[float] | Callable[[], Sequence[float]]
    embedding_model: str
    params: RecallParams
    as_of: NotRequired[datetime | None]
    exact: NotRequired[bool]
    spare: NotRequired[Sequence[Spare]]
    echo: NotRequired[str]


def _candidates(rows: Sequence[tuple], raw_rows: Sequence[tuple], held_by: Mapping[str, str], *,
                d_text: Sequence[LegHit], d_vec: Sequence[LegHit], m_text: Sequence[LegHit],
                m_vec: Sequence[LegHit], c_vec: Sequence[LegHit]) -> list[Candidate]:
    """Each candidate row (:data:`_CANDIDATE_ROWS_SQL`) with its signals and ranks from the legs' hits
    (the exchange legs' through ``held_by``, the distillation holding each exchange), and each raw
    row (:data:`_RAW_ROWS_SQL`, an exchange no active distillation holds) as a raw candidate."""
    # An exchange's BM25 and cosine count for the distillation that holds it; a distillation
    # holding several (merges) keeps the best of each. A raw exchange stands for itself.
    itself = {row[0]: row[0] for row in raw_rows}
    targets = {**held_by, **itself}
    bm25_exchange = _best_per_distillation(m_text, targets)
    cos_exchange = _best_per_distillation(m_vec, targets)
    cos_context = _best_per_distillation(c_vec, targets)
    bm25_distillation = {h.id: h.score for h in d_text}
    # The row's own cosines, or an exchange leg's better one for another exchange it holds.
    exchange_cos = {r[0]: _better(r[6], cos_exchange.get(r[0])) for r in rows}
    context_cos = {r[0]: _better(r[8], cos_context.get(r[0])) for r in rows}
    raw_cos = {r[0]: _better(r[2], cos_exchange.get(r[0])) for r in raw_rows}
    raw_context_cos = {r[0]: _better(r[3], cos_context.get(r[0])) for r in raw_rows}
    # A raw exchange's own text is what a distillation would be: its cosine counts in both places.
    best_cos_d = _best_of([*(float(r[5]) for r in rows), *raw_cos.values()], d_vec[0].score if d_vec else None)
    best_cos_x = _best_of([*exchange_cos.values(), *raw_cos.values()], m_vec[0].score if m_vec else None)
    best_cos_c = _best_of([*context_cos.values(), *raw_context_cos.values()], c_vec[0].score if c_vec else None)
    # An exchange not yet embedded (just stored) is read as close as the best known one
    # (:data:`UNKNOWN_COSINE` when none is known): its words made it a candidate.
    stand_in = _best_of((best_cos_x, best_cos_d), None)
    stand_in = UNKNOWN_COSINE if stand_in is None else stand_in
    if best_cos_d is None:
        best_cos_d = stand_in
    best_bm25_d = d_text[0].score if d_text else 0.0
    best_bm25_x = m_text[0].score if m_text else 0.0

    # Each candidate's rank in every leg that proposed it, read once per leg.
    ranks: dict[str, dict[Leg, int]] = {}
    for leg, ids in (("distillation_text", (h.id for h in d_text)), ("distillation_vector", (h.id for h in d_vec)),
                     ("exchange_text", (targets[h.id] for h in m_text if h.id in targets)),
                     ("exchange_vector", (targets[h.id] for h in m_vec if h.id in targets)),
                     ("context_vector", (targets[h.id] for h in c_vec if h.id in targets))):
        for memory_id, rank in _rank_leg(ids).items():
            ranks.setdefault(memory_id, {})[leg] = rank
    candidates = []
    for row in rows:
        distillation_id = row[0]
        signals = RelevanceSignals(
            cos_distillation=float(row[5]), cos_exchange=exchange_cos[distillation_id],
            bm25_distillation=bm25_distillation.get(distillation_id, 0.0),
            bm25_exchange=bm25_exchange.get(distillation_id, 0.0),
            best_cos_distillation=best_cos_d, best_cos_exchange=best_cos_x,
            best_bm25_distillation=best_bm25_d, best_bm25_exchange=best_bm25_x,
            cos_context=context_cos[distillation_id], best_cos_context=best_cos_c)
        candidates.append(Candidate(
            id=distillation_id, tier=row[1], warmth=float(row[2]), user_weight=float(row[3]), refreshed_at=row[4],
            signals=signals, ranks=ranks.get(distillation_id, {}), superseded_by=row[7]))
    for memory_id, occurred_at, _, _ in raw_rows:
        own = raw_cos[memory_id]
        signals = RelevanceSignals(
            cos_distillation=stand_in if own is None else own, cos_exchange=own,
            bm25_distillation=0.0, bm25_exchange=bm25_exchange.get(memory_id, 0.0),
            best_cos_distillation=best_cos_d, best_cos_exchange=best_cos_x,
            best_bm25_distillation=best_bm25_d, best_bm25_exchange=best_bm25_x,
            cos_context=raw_context_cos[memory_id], best_cos_context=best_cos_c, raw=True)
        candidates.append(Candidate(
            id=memory_id, tier=RAW_TIER, warmth=RAW_WARMTH, user_weight=RAW_USER_WEIGHT, refreshed_at=occurred_at,
            signals=signals, ranks=ranks.get(memory_id, {}), kind="raw"))
    return candidates


def _better(value: float | None, other: float | None) -> float | None:
    """The larger of two cosines either of which may be unknown (None)."""
    if value is None:
        return other
    return float(value) if other is None else max(float(value), other)


def _best_of(values: Iterable[float | None], other: float | None) -> float | None:
    """The largest known value of ``values`` and ``other``; None when none is known."""
    return max((v for v in (*values, other) if v is not None), default=None)


def recall_candidates(conn: psycopg.Connection, **ask: Unpack[CandidateQuery]) -> list[Candidate]:
    """Run the five legs and return, per active distillation any of them proposed, and per exchange
    they proposed that no active distillation holds (a raw candidate), its signals
    (:class:`CandidateQuery` says what each argument does)."""
    user_id, query, embedding_model, params = ask["user_id"], ask["query"], ask["embedding_model"], ask["params"]
    as_of, exact = ask.get("as_of"), ask.get("exact", False)
    given = ask["query_embedding"]
    # Awaited by the first leg that needs it; the others find it done (a Future's result is kept).
    vector = functools.cache(lambda: np.asarray(given() if callable(given) else given, dtype=np.float32))
    size = params.leg_size
    # A stored context (words or vector) can hold what was said after ``as_of`` (the next
    # exchange's): as of a past moment each exchange is searched alone.
    use_context = params.exchange_context and as_of is None
    own = _Once(lambda c: user_indexes(c, user_id) if not exact else frozenset())

    def vector_leg(table: Literal["memories", "distillations"], context: bool = False) -> _Leg:
        def run(c: psycopg.Connection) -> list[LegHit]:
            # Which own indexes the user has is asked first, while the query is still being embedded.
            mine = (table, "context_embedding" if context else "embedding") in own(c)
            return vector_search(c, table=table, user_id=user_id, query_embedding=vector(), context=context,
                                 embedding_model=embedding_model, limit=size, exact=exact,
                                 as_of=None if context else as_of, own_index=mine)
        return run

    # The text legs first: they need no vector, so they run while the query's is still being
    # computed (services.recall); the slower of them (exchanges in context) before the other.
    m_text, d_text, d_vec, m_vec, c_vec = _run_legs(conn, [
        lambda c: bm25_search(c, table="memories", user_id=user_id, query=query, limit=size,
                              context=use_context, as_of=as_of),
        lambda c: bm25_search(c, table="distillations", user_id=user_id, query=query, limit=size,
                              embedding_model=embedding_model, as_of=as_of),
        vector_leg("distillations"),
        vector_leg("memories"),
        vector_leg("memories", context=True) if use_context else lambda c: [],
    ], ask.get("spare", ()))
    # What the distillation legs proposed is known now; what the exchange legs found must first be
    # mapped to the distillations holding it. The rows of the former are read on a second
    # connection while the mapping, then the rows of the distillations only it adds, run on this
    # one: a tail that ran on one core while the other waited (about 130 rows, 40 of them added).
    proposed = {h.id for h in d_text + d_vec}
    row_args = {"q": vector(), "user": user_id, "model": embedding_model, "as_of": as_of, "context": use_context}

    def rows_of(c: psycopg.Connection, ids: set[str]) -> list[tuple]:
        return c.execute(_CANDIDATE_ROWS_SQL, {**row_args, "ids": uuid_array(sorted(ids))}).fetchall() if ids else []

    def mapped(c: psycopg.Connection) -> tuple[dict[str, str], list[tuple], list[tuple]]:
        found = [h.id for h in m_text + m_vec + c_vec]
        held = recallable_distillations(c, user_id=user_id, memory_ids=found, embedding_model=embedding_model)
        # What no active distillation holds is recalled as the user's own words.
        raw = set(found) - held.keys() if params.raw_exchanges else set()
        raw_rows = c.execute(_RAW_ROWS_SQL, {**row_args, "ids": uuid_array(sorted(raw))}).fetchall() if raw else []
        return held, rows_of(c, set(held.values()) - proposed), raw_rows

    (held_by, added_rows, raw_rows), proposed_rows = _run_legs(
        conn, [mapped, lambda c: rows_of(c, proposed)], ask.get("spare", ())[:1])  # type: ignore[list-item]
    rows = sorted(proposed_rows + added_rows, key=lambda r: r[0])
    # An exchange whose words are the query's own (the same question asked before, its turn stored)
    # is no evidence of an answer: it would only stand out as the best match of its own text, and
    # make the query look answerable. It leaves every leg.
    asked = ask.get("echo") or query
    echoes = {r[0] for r in raw_rows if same_words(users_words(r[2])[0], asked)}
    if echoes:
        m_text, m_vec, c_vec = ([h for h in hits if h.id not in echoes] for hits in (m_text, m_vec, c_vec))
    raw_rows = sorted(((r[0], r[1], r[3], r[4]) for r in raw_rows if r[0] not in echoes), key=lambda r: r[0])
    if not rows and not raw_rows:
        # As of a past moment an exchange can be held by a distillation it was merged into later,
        # whose own exchange came after that moment: not a candidate then (found by hypothesis).
        return []

    return _candidates(rows, raw_rows, held_by, d_text=d_text, d_vec=d_vec, m_text=m_text, m_vec=m_vec,
                       c_vec=c_vec)


def recall(conn: psycopg.Connection, *, model: RelevanceModel, now: datetime | None = None,
           **ask: Unpack[CandidateQuery]) -> list[RankedMemory]:
    """The user's best ``params.limit`` memories for ``query``, best first (``core.recall.rank_memories``;
    a question about the present gets its first few newest first, ``core.query_intent``).

    ``as_of`` recalls as of that moment: only what had happened by then, aged from then.
    """
    params, as_of = ask["params"], ask.get("as_of")
    if model.embedding_model != ask["embedding_model"]:
        raise ValueError(f"relevance model {model.version} was fitted for {model.embedding_model}, "
                         f"not {ask['embedding_model']}: run `yak eval calibrate` for this embedder")
    if params.limit <= 0:
        return []
    now = as_of or now or datetime.now(UTC)
    return rank_memories(recall_candidates(conn, **ask), model=model, params=params, now=now,
                         about_present=asks_about_present(ask["query"]))


# --- exchange vectors -----------------------------------------------------------------------------


def exchanges_without_embedding(conn: psycopg.Connection, *, embedding_model: str, user_id: str | None = None,
                                limit: int = 256, context: bool = False,
                                ids: Sequence[str] | None = None) -> list[tuple[str, str]]:
    """Up to ``limit`` live exchanges with no vector of ``embedding_model``: (id, text to embed), locked.

    ``ids``: only these exchanges (a write that has just stored them embeds them at once).
    With ``context``, the vector of the exchange read with its neighbours (sql/008), whose text
    is the exchange between its neighbours (``yak_exchange_context_text``). ``FOR UPDATE SKIP
    LOCKED`` lets several workers fill vectors at once without doing the same row twice.
    """
    column, text = ("context_embedding", "yak_exchange_context_text(id)") if context else ("embedding", "content")
    rows = conn.execute(
        f"""SELECT id, {text} FROM memories
            WHERE deleted_at IS NULL AND (%(user)s::text IS NULL OR user_id = %(user)s)
              AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))
              AND ({column} IS NULL OR {column}_model IS DISTINCT FROM %(model)s)
            ORDER BY occurred_at, id
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED""",  # noqa: S608 - fixed column names
        {"user": user_id, "model": embedding_model, "limit": limit, "ids": None if ids is None else uuid_array(ids)},
    ).fetchall()
    return [(str(r[0]), r[1]) for r in rows]


def set_exchange_embeddings(conn: psycopg.Connection, *, embedding_model: str,
                            vectors: Mapping[str, Sequence[float]], context: bool = False) -> int:
    """Store each exchange's vector (by memory id; with ``context``, its context vector) and the model; rows given."""
    if not vectors:
        return 0
    column = "context_embedding" if context else "embedding"
    with conn.cursor() as cur:
        cur.executemany(
            f"UPDATE memories SET {column} = %s, {column}_model = %s WHERE id = %s",  # noqa: S608 - fixed names
            [(np.asarray(v, dtype=np.float32), embedding_model, memory_id) for memory_id, v in vectors.items()],
        )
    return len(vectors)
