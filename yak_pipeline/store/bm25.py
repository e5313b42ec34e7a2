"""Recall's text legs: Okapi BM25 over the user's rows (PostgreSQL full text).

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
"""

from __future__ import annotations

from datetime import datetime
from typing import Final, Literal

import psycopg

from yak_pipeline.store.recall_legs import LEG_WHERE, LegHit
from yak_pipeline.store.rows import one_value

# Okapi BM25's usual constants (Robertson & Zaragoza); not tuned to any data set.
BM25_K1: Final[float] = 1.2
BM25_B: Final[float] = 0.75

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
    statement = _BM25_SQL.format(table=table, where=LEG_WHERE[table], tsv=f"{column}_tsv", terms=f"{column}_terms")
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
    return one_value(conn, "SELECT yak_bm25_fold_statistics()", None, int)
