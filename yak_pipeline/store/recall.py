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

The legs are ``store.bm25`` (text) and ``store.vector_legs`` (cosine), over the rows
``store.recall_legs`` names; ``store.leg_runner`` runs them side by side, and
``store.recallable_distillations`` maps the exchanges they find to the distillations holding them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Final, Literal, NamedTuple, NotRequired, TypedDict, Unpack, cast

import numpy as np
import psycopg

from yak_pipeline.core.answer_kinds import AnswerKind, holds_kind, wanted_kind
from yak_pipeline.core.exchanges import same_words, users_words
from yak_pipeline.core.query_intent import asks_about_past, asks_about_present
from yak_pipeline.core.recall import Candidate, Leg, RankedMemory, RecallParams, rank_memories
from yak_pipeline.core.relevance import RelevanceModel, RelevanceSignals, speaks_of_self
from yak_pipeline.core.types import Tier
from yak_pipeline.core.updates import tells_of_change
from yak_pipeline.store.bm25 import bm25_search
from yak_pipeline.store.leg_runner import Once, Spare, run_legs
from yak_pipeline.store.recall_legs import LegHit
from yak_pipeline.store.recallable_distillations import recallable_distillations
from yak_pipeline.store.rows import tuple_row_of, uuid_array
from yak_pipeline.store.user_indexes import user_indexes
from yak_pipeline.store.vector_legs import vector_search

# Ids come back as text throughout recall: a uuid object per row (about a thousand per recall),
# made and then turned into a string, cost 1.5 ms of Python CPU per recall at 100,000 rows.
# Per candidate: the score's inputs, the cosine to the distillation, to its own exchange and to
# that exchange in its context (when ``context``), the newer memory that replaced it (only
# if that one had happened by ``as_of``), and its text (``core.recall``'s update reading).
_CANDIDATE_ROWS_SQL: Final[str] = """
SELECT d.id::text, d.tier, d.warmth, d.user_weight, d.refreshed_at,
       1 - (d.embedding <=> %(q)s) AS cos_distillation,
       CASE WHEN m.embedding_model = %(model)s THEN 1 - (m.embedding <=> %(q)s) END AS cos_exchange,
       CASE WHEN %(as_of)s::timestamptz IS NULL OR sm.occurred_at <= %(as_of)s THEN s.id::text END AS superseded_by,
       CASE WHEN %(context)s AND m.context_embedding_model = %(model)s
            THEN 1 - (m.context_embedding <=> %(q)s) END AS cos_context,
       d.content
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


class _CandidateRow(NamedTuple):
    """A row of :data:`_CANDIDATE_ROWS_SQL`."""

    id: str
    tier: Tier
    warmth: float
    user_weight: float
    refreshed_at: datetime
    cos_distillation: float
    cos_exchange: float | None
    superseded_by: str | None
    cos_context: float | None
    content: str


class _RawRow(NamedTuple):
    """A row of :data:`_RAW_ROWS_SQL`."""

    id: str
    occurred_at: datetime
    content: str
    cos_exchange: float | None
    cos_context: float | None


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


def _rank_leg(ids: Iterable[str]) -> dict[str, int]:
    """1-based ranks of ids in order, keeping each id's first (best) position."""
    ranks: dict[str, int] = {}
    for distillation_id in ids:
        if distillation_id not in ranks:
            ranks[distillation_id] = len(ranks) + 1
    return ranks


# One leg of recall: its query on the connection it is given.
_Leg = Callable[[psycopg.Connection], list[LegHit]]


class CandidateQuery(TypedDict):
    """What the candidate legs are asked: a user's query, its vector, and how to search.

    ``query_embedding`` is the query's vector, or a call that returns it (a ``Future``'s
    ``result``, the vector still being computed): the text legs need no vector and start at once,
    the vector legs wait for it. ``exact`` scans the vector legs exactly (the reference); ``as_of``
    sees only what had happened by then. With ``spare`` connections — held ones, or calls that lend
    one (``Database.idle_connection``) — the legs run side by side, on the request's connection
    and on them (``store.leg_runner.run_legs``). ``echo`` is the message being answered when it is
    not ``query`` itself (the proxy's follow-up, read after the message before it): an exchange
    that says just that is an earlier asking of the same question, not evidence (default: ``query``).
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


def _candidates(rows: Sequence[_CandidateRow], raw_rows: Sequence[_RawRow], held_by: Mapping[str, str], *,
                said: Mapping[str, str], d_text: Sequence[LegHit], d_vec: Sequence[LegHit],
                m_text: Sequence[LegHit], m_vec: Sequence[LegHit], c_vec: Sequence[LegHit],
                wanted: AnswerKind | None, present: bool) -> list[Candidate]:
    """Each candidate row (:data:`_CANDIDATE_ROWS_SQL`) with its signals and ranks from the legs' hits
    (the exchange legs' through ``held_by``, the distillation holding each exchange), and each raw
    row (:data:`_RAW_ROWS_SQL`, an exchange no active distillation holds) as a raw candidate, each
    with the words the update reading reads (a distillation's text; an exchange's user side,
    ``said``, by its id); ``wanted`` is the kind of thing the query asks for (``core.answer_kinds``),
    looked for in those words; ``present``, whether the query asks about the present, when a
    distillation's words that tell of a change count (``core.updates.tells_of_change``)."""
    # An exchange's BM25 and cosine count for the distillation that holds it; a distillation
    # holding several (merges) keeps the best of each. A raw exchange stands for itself.
    itself = {row.id: row.id for row in raw_rows}
    targets = {**held_by, **itself}
    bm25_exchange = _best_per_distillation(m_text, targets)
    cos_exchange = _best_per_distillation(m_vec, targets)
    cos_context = _best_per_distillation(c_vec, targets)
    bm25_distillation = {h.id: h.score for h in d_text}
    # The row's own cosines, or an exchange leg's better one for another exchange it holds.
    exchange_cos = {r.id: _better(r.cos_exchange, cos_exchange.get(r.id)) for r in rows}
    context_cos = {r.id: _better(r.cos_context, cos_context.get(r.id)) for r in rows}
    raw_cos = {r.id: _better(r.cos_exchange, cos_exchange.get(r.id)) for r in raw_rows}
    raw_context_cos = {r.id: _better(r.cos_context, cos_context.get(r.id)) for r in raw_rows}
    # A raw exchange's own text is what a distillation would be: its cosine counts in both places.
    best_cos_d = _best_of([*(float(r.cos_distillation) for r in rows), *raw_cos.values()],
                          d_vec[0].score if d_vec else None)
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
    legs: tuple[tuple[Leg, Iterable[str]], ...] = (
        ("distillation_text", (h.id for h in d_text)), ("distillation_vector", (h.id for h in d_vec)),
        ("exchange_text", (targets[h.id] for h in m_text if h.id in targets)),
        ("exchange_vector", (targets[h.id] for h in m_vec if h.id in targets)),
        ("context_vector", (targets[h.id] for h in c_vec if h.id in targets)))
    for leg, ids in legs:
        for memory_id, rank in _rank_leg(ids).items():
            ranks.setdefault(memory_id, {})[leg] = rank
    candidates = []
    for row in rows:
        distillation_id = row.id
        signals = RelevanceSignals(
            cos_distillation=float(row.cos_distillation), cos_exchange=exchange_cos[distillation_id],
            bm25_distillation=bm25_distillation.get(distillation_id, 0.0),
            bm25_exchange=bm25_exchange.get(distillation_id, 0.0),
            best_cos_distillation=best_cos_d, best_cos_exchange=best_cos_x,
            best_bm25_distillation=best_bm25_d, best_bm25_exchange=best_bm25_x,
            cos_context=context_cos[distillation_id], best_cos_context=best_cos_c,
            answer_kind=holds_kind(wanted, row.content), present_change=present and tells_of_change(row.content))
        candidates.append(Candidate(
            id=distillation_id, tier=row.tier, warmth=float(row.warmth), user_weight=float(row.user_weight),
            refreshed_at=row.refreshed_at, signals=signals, ranks=ranks.get(distillation_id, {}),
            superseded_by=row.superseded_by, words=row.content))
    for raw_row in raw_rows:
        memory_id, occurred_at = raw_row.id, raw_row.occurred_at
        own = raw_cos[memory_id]
        signals = RelevanceSignals(
            cos_distillation=stand_in if own is None else own, cos_exchange=own,
            bm25_distillation=0.0, bm25_exchange=bm25_exchange.get(memory_id, 0.0),
            best_cos_distillation=best_cos_d, best_cos_exchange=best_cos_x,
            best_bm25_distillation=best_bm25_d, best_bm25_exchange=best_bm25_x,
            cos_context=raw_context_cos[memory_id], best_cos_context=best_cos_c, raw=True,
            about_self=speaks_of_self(said[memory_id]), answer_kind=holds_kind(wanted, said[memory_id]))
        candidates.append(Candidate(
            id=memory_id, tier=RAW_TIER, warmth=RAW_WARMTH, user_weight=RAW_USER_WEIGHT, refreshed_at=occurred_at,
            signals=signals, ranks=ranks.get(memory_id, {}), kind="raw", words=said[memory_id]))
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
    own = Once(lambda c: user_indexes(c, user_id) if not exact else frozenset())

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
    m_text, d_text, d_vec, m_vec, c_vec = run_legs(conn, [
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

    def rows_of(c: psycopg.Connection, ids: set[str]) -> list[_CandidateRow]:
        if not ids:
            return []
        with c.cursor(row_factory=tuple_row_of(_CandidateRow)) as cur:
            return cur.execute(_CANDIDATE_ROWS_SQL, {**row_args, "ids": uuid_array(sorted(ids))}).fetchall()

    def mapped(c: psycopg.Connection) -> tuple[dict[str, str], list[_CandidateRow], list[_RawRow]]:
        found = [h.id for h in m_text + m_vec + c_vec]
        held = recallable_distillations(c, user_id=user_id, memory_ids=found, embedding_model=embedding_model)
        # What no active distillation holds is recalled as the user's own words.
        raw = set(found) - held.keys() if params.raw_exchanges else set()
        raw_rows: list[_RawRow] = []
        if raw:
            with c.cursor(row_factory=tuple_row_of(_RawRow)) as cur:
                raw_rows = cur.execute(_RAW_ROWS_SQL, {**row_args, "ids": uuid_array(sorted(raw))}).fetchall()
        return held, rows_of(c, set(held.values()) - proposed), raw_rows

    # The two legs return different things: each is read back as what it returns, below.
    first, second = run_legs(conn, [mapped, lambda c: rows_of(c, proposed)], ask.get("spare", ())[:1])
    held_by, added_rows, raw_rows = cast(tuple[dict[str, str], list[_CandidateRow], list[_RawRow]], first)
    proposed_rows = cast(list[_CandidateRow], second)
    rows = sorted(proposed_rows + added_rows, key=lambda r: r.id)
    # An exchange whose words are the query's own (the same question asked before, its turn stored)
    # is no evidence of an answer: it would only stand out as the best match of its own text, and
    # make the query look answerable. It leaves every leg.
    asked = ask.get("echo") or query
    # The user's side of each exchange, read once: for this check and for the update reading.
    said = {r.id: users_words(r.content)[0] for r in raw_rows}
    echoes = {memory_id for memory_id, words in said.items() if same_words(words, asked)}
    if echoes:
        m_text, m_vec, c_vec = ([h for h in hits if h.id not in echoes] for hits in (m_text, m_vec, c_vec))
    raw_rows = sorted((r for r in raw_rows if r.id not in echoes), key=lambda r: r.id)
    if not rows and not raw_rows:
        # As of a past moment an exchange can be held by a distillation it was merged into later,
        # whose own exchange came after that moment: not a candidate then (found by hypothesis).
        return []
    return _candidates(rows, raw_rows, held_by, said=said, d_text=d_text, d_vec=d_vec, m_text=m_text, m_vec=m_vec,
                       c_vec=c_vec, wanted=wanted_kind(query), present=asks_about_present(query))


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
                         about_present=asks_about_present(ask["query"]), about_past=asks_about_past(ask["query"]))
