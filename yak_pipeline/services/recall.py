"""Recall for a query: embed it, run the one recall engine, attach the memories' text.

``store.recall.recall`` gathers the candidates (BM25 and vectors over distillations and their
exchanges) and ``core.recall.rank_memories`` turns them into calibrated relevance, the tier gate,
the score and the order (docs/RECALL.md). The API's context and search routes, the CLI and the
evaluation all come through :func:`search_memories`. Exchange vectors, of each exchange alone
and read with its neighbours (sql/008), are filled by :func:`embed_pending_exchanges` (recall
itself never writes); until an exchange has them, it is found by its words and its
distillation's vector only.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime
from functools import lru_cache, partial
from pathlib import Path
from typing import NotRequired, TypedDict, Unpack

import psycopg

from yak_pipeline.core.block_choice import (
    BlockChoice,
    block_shape,
    fit_text,
    line_tokens,
    within_odds_gap,
    within_token_budget,
)
from yak_pipeline.core.exchanges import users_words
from yak_pipeline.core.memory_block import BlockMemory, PromptBuild, build_prompt_messages
from yak_pipeline.core.query_intent import asks_about_past, query_parts
from yak_pipeline.core.recall import RankedMemory, RecallParams, interleave
from yak_pipeline.core.relevance import RelevanceModel, RelevanceSignals
from yak_pipeline.embeddings import Embedder
from yak_pipeline.llm.errors import LLMError, reason_for_log
from yak_pipeline.llm.provider import LLMProvider
from yak_pipeline.llm.rules.words import STOP_WORDS, words_of
from yak_pipeline.recall_models import load_relevance_model
from yak_pipeline.services.profile import block_profile
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database, connect
from yak_pipeline.store.distillations import recall_hit_rows
from yak_pipeline.store.memories import raw_hit_rows
from yak_pipeline.store.recall import (
    Spare,
    exchanges_without_embedding,
    fold_bm25_statistics,
    recall,
    recall_candidates,
    set_exchange_embeddings,
)
from yak_pipeline.store.user_indexes import USER_INDEX_MIN_ROWS, ensure_user_indexes

# The shells word their progress with it and call services, not the store.
from yak_pipeline.store.user_indexes import describe_build as describe_build  # noqa: F401 - re-exported

logger = logging.getLogger("yak.recall")

@dataclass(frozen=True)
class RecallHit:
    """One recalled memory: what it says, its date, and its score with every factor.

    A distilled hit's ``content`` is the distillation; a raw hit's (``kind == "raw"``, an exchange
    no active distillation holds) is what the user said, and ``reply`` the assistant's side of
    that exchange, context only, never a fact about the user. A raw hit has no ``confidence``
    (no LLM wrote it).
    """

    ranked: RankedMemory
    memory_id: str
    content: str
    confidence: float | None
    occurred_at: datetime
    in_conflict: bool
    # The LLM's judgement of this memory for the query (:class:`LLMRecallJudge`), when one judged it.
    judgement: float | None = None
    reply: str | None = None
    # What kind of thing a distilled hit says (core.memory_types) and an event's day; a raw hit, the
    # user's own words, has no type.
    memory_type: str | None = None
    event_on: date | None = None
    # Why it ranked, in plain words (``RankedMemory.reasons`` and the words it shares with the query).
    why: tuple[str, ...] = ()

    # The ranking's own values, read through (one copy of each).
    id = property(lambda self: self.ranked.id)
    kind = property(lambda self: self.ranked.kind)
    tier = property(lambda self: self.ranked.tier)
    warmth = property(lambda self: self.ranked.warmth)
    similarity = property(lambda self: self.ranked.similarity)
    relevance = property(lambda self: self.ranked.relevance)
    score = property(lambda self: self.ranked.score)
    rank_odds = property(lambda self: self.ranked.rank_odds)
    superseded_by = property(lambda self: self.ranked.superseded_by)

    @property
    def is_core(self) -> bool:
        """Core memories get the wider gate and double gravity."""
        return self.tier == "core"

    def explain(self) -> dict[str, object]:
        """The score breakdown (relevance and its legs, decay, warmth, gravity, supersession), and
        the LLM's judgement when one judged the memory."""
        breakdown = {"why": list(self.why), **self.ranked.explain()}
        if self.judgement is not None:
            breakdown["llm_judgement"] = self.judgement
        return breakdown


class LLMRecallJudge:
    """An optional second opinion on what recall found: the configured LLM reads the query with
    each memory that passed the gate, and memories it scores below ``keep`` are dropped.

    It asks the LLM's usefulness judgement (``LLMProvider.relevance_score``, the warmth
    evaluator's), with the user's message alone as the turn: "the turn clearly depends on what
    the memory says" is what recall wants to know. The engine's order is kept: the judge only
    removes (a near miss such as "my brother" for a memory about a sister, which the embedder's
    cosine cannot tell apart). One call per memory, ``concurrency`` at a time. When the LLM fails
    the engine's hits are returned unjudged (recall never fails because its judge did).
    """

    def __init__(self, llm: LLMProvider, *, keep: float, concurrency: int) -> None:
        self.llm = llm
        self.keep = keep
        self.concurrency = max(1, concurrency)

    @classmethod
    def from_settings(cls, settings: Settings, llm: LLMProvider) -> LLMRecallJudge:
        """A judge asking ``llm``, with ``YAK_RECALL_LLM_JUDGE_KEEP`` and ``YAK_LLM_CONCURRENCY``."""
        return cls(llm, keep=settings.recall_llm_judge_keep, concurrency=settings.llm_concurrency)

    def kept(self, query: str, memories: Sequence[str]) -> list[tuple[int, float]] | None:
        """``(index, score)`` of each memory text the LLM scores at least ``keep`` for ``query``, in
        order; None when the LLM failed (the caller keeps every memory)."""
        if not memories:
            return []
        turn = "User: " + query
        try:
            with ThreadPoolExecutor(max_workers=min(self.concurrency, len(memories))) as pool:
                scores = list(pool.map(lambda memory: self.llm.relevance_score(memory, turn).score, memories))
        except LLMError as exc:
            logger.warning("the LLM could not judge recall; keeping the engine's %d memories: %s", len(memories),
                           reason_for_log(exc.reason))
            return None
        return [(i, score) for i, score in enumerate(scores) if score >= self.keep]

    def judge(self, query: str, hits: Sequence[RecallHit]) -> list[RecallHit]:
        """``hits`` the LLM scores at least ``keep`` for ``query``, in their order, each with its score."""
        kept = self.kept(query, [h.content for h in hits])
        if kept is None:
            return list(hits)
        return [replace(hits[i], judgement=score) for i, score in kept]


def recall_judge(settings: Settings, llm: Callable[[], LLMProvider]) -> LLMRecallJudge | None:
    """The LLM judge when ``YAK_RECALL_LLM_JUDGE`` is on and an LLM endpoint is configured, else None
    (the offline rules provider's word overlap is no judge of a paraphrase)."""
    if not settings.recall_llm_judge or not settings.llm_base_url:
        return None
    return LLMRecallJudge.from_settings(settings, llm())


# Recall's five legs run side by side on the request's connection and up to this many more that
# the pool has free at that moment (none when it is busy: then one after another, as before).
# One per core, four at most (five legs). Each borrowed connection costs the pool's check and a
# commit: on 2 cores two spares were as fast as four at 100,000 rows (44.9-57.9 vs 52.5-59.4 ms
# p50) and faster at 3,000 (14.6-19.5 vs 19.6-20.5 ms; docs/BENCHMARKS.md §2d).
SPARE_LEG_CONNECTIONS = min(4, os.cpu_count() or 1)
# Threads that embed recall's queries beside the text legs, one per core: an embedding is
# CPU work (the local model runs on one thread per call) or a wait on a remote embedder.
_QUERY_VECTORS = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="yak-query-vector")


def spare_connections(db: Database) -> list[Spare]:
    """What recall's helper threads borrow their connections from (``store.recall._run_legs``): up to
    :data:`SPARE_LEG_CONNECTIONS` of the pool's free ones, in autocommit mode like the request's own."""
    return [partial(db.idle_connection, autocommit=True)] * SPARE_LEG_CONNECTIONS


def recall_params(settings: Settings, *, threshold: float = 0.7, limit: int = 5) -> RecallParams:
    """Recall parameters: the request's threshold and limit, the configured scoring and search."""
    return RecallParams(threshold=threshold, limit=limit, half_life_days=settings.half_life_days,
                        decay_enabled=settings.decay_enabled, core_multiplier=settings.core_threshold_multiplier,
                        relevance_exponent=settings.recall_relevance_exponent,
                        superseded_factor=settings.recall_superseded_factor,
                        leg_size=settings.recall_leg_size, exchange_context=settings.recall_exchange_context,
                        present_newest_first=settings.recall_present_newest_first,
                        raw_exchanges=settings.recall_raw_exchanges, query_parts=settings.recall_query_parts)


def block_choice(settings: Settings) -> BlockChoice:
    """How the memory block is chosen from what recall ranks: the configured odds gap and token budget."""
    return BlockChoice(odds_gap=settings.recall_block_odds_gap, token_budget=settings.recall_block_tokens,
                       profile_tokens=settings.profile_tokens, gather_limit=settings.recall_gather_limit)


@lru_cache(maxsize=16)
def _cached_model(embedding_model: str, home: Path) -> RelevanceModel:
    return load_relevance_model(embedding_model, home=home)


def relevance_model(settings: Settings, embedder: Embedder) -> RelevanceModel:
    """The relevance model fitted for the configured embedder (read once per process)."""
    return _cached_model(embedder.model_name, Path(settings.home))


class RecallRequest(TypedDict):
    """One recall: whose memories, for what text, with which parameters and relevance model.

    ``now`` ages the memories (default: the current time); ``as_of`` recalls as of that moment
    (only what had been said by then, aged from then); ``echo``: the message being answered, when
    ``query`` is more than it (``store.recall.CandidateQuery``).
    """

    user_id: str
    query: str
    params: RecallParams
    model: RelevanceModel
    now: NotRequired[datetime | None]
    as_of: NotRequired[datetime | None]
    echo: NotRequired[str]


def search_memories(db: Database, embedder: Embedder, *, judge: LLMRecallJudge | None = None,
                    **ask: Unpack[RecallRequest]) -> list[RecallHit]:
    """The user's best memories for ``query`` (distillations, and exchanges no active distillation
    holds, as the user's words), best first; empty when nothing is relevant.

    With a ``judge`` (:func:`recall_judge`), the LLM's judgement then drops what it finds irrelevant."""
    # The query's vector is computed while the text legs run (``store.recall.CandidateQuery``).
    vector = _QUERY_VECTORS.submit(embedder.embed_query, ask["query"])
    # A question listing several things is recalled for each too (core.query_intent.query_parts).
    parts = query_parts(ask["query"]) if ask["params"].query_parts else []
    part_vectors = [_QUERY_VECTORS.submit(embedder.embed_query, part) for part in parts]
    # Recall only reads, on several connections at once: no transactions (``Database.connection``).
    with db.connection(autocommit=True) as conn:
        ranked = recall(conn, query_embedding=vector.result, embedding_model=embedder.model_name,
                        spare=spare_connections(db), **ask)
        if parts:
            # Each part is its own query; the message being answered stays the whole question.
            rankings = [ranked] + [
                recall(conn, query_embedding=part_vector.result, embedding_model=embedder.model_name,
                       spare=spare_connections(db), **{**ask, "query": part, "echo": ask.get("echo") or ask["query"]})
                for part, part_vector in zip(parts, part_vectors)]
            ranked = interleave(rankings, ask["params"].limit)
        if not ranked:
            return []
        hits = recall_hits(conn, ranked, query=ask["query"],
                           now=ask.get("as_of") or ask.get("now") or datetime.now(UTC))
    return judge.judge(ask["query"], hits) if judge is not None else hits


def shared_words(query: str, text: str) -> list[str]:
    """The query's content words that ``text`` also has (case aside), in the query's order."""
    have = set(words_of(text))
    return list(dict.fromkeys(w for w in words_of(query) if w in have and w not in STOP_WORDS and len(w) > 1))


def _why(ranked: RankedMemory, query: str, content: str, now: datetime) -> tuple[str, ...]:
    reasons = ranked.reasons(now)
    matched = shared_words(query, content)
    if matched:
        reasons.append("matched words: " + ", ".join(matched[:8]))
    return tuple(reasons)


def recall_hits(conn: psycopg.Connection, ranked: Sequence[RankedMemory], *, query: str = "",
                now: datetime | None = None) -> list[RecallHit]:
    """The ranked memories with what each shows (a row forgotten meanwhile is left out), in order;
    with ``now``, each with its reasons in plain words (words shared with ``query`` among them)."""
    distilled = recall_hit_rows(conn, [r.id for r in ranked if r.kind == "distilled"])
    raw = raw_hit_rows(conn, [r.id for r in ranked if r.kind == "raw"])
    hits = []
    for r in ranked:
        if r.kind == "raw" and r.id in raw:
            said, reply = users_words(raw[r.id][1])
            hits.append(RecallHit(ranked=r, memory_id=r.id, content=said, confidence=None,
                                  occurred_at=raw[r.id][2], in_conflict=False, reply=reply,
                                  why=_why(r, query, said, now) if now is not None else ()))
        elif r.kind == "distilled" and r.id in distilled:
            row = distilled[r.id]
            hits.append(RecallHit(ranked=r, memory_id=str(row[1]), content=row[2], confidence=row[3],
                                  occurred_at=row[4], in_conflict=bool(row[5]), memory_type=row[6], event_on=row[7],
                                  why=_why(r, query, row[2], now) if now is not None else ()))
    return hits


def signals_for_text(
    conn: psycopg.Connection,
    embedder: Embedder,
    *,
    user_id: str,
    text: str,
    params: RecallParams,
) -> dict[str, RelevanceSignals]:
    """The signals of each of the user's distillations that recall would gather for ``text``, by id.

    A memory seen here has its gaps measured to the user's best distillations for ``text``; one
    that no leg proposes is absent (it is unrelated). Raw exchanges are left out: the turn being
    judged is itself one, and would stand out as the best match of its own text.
    """
    candidates = recall_candidates(conn, user_id=user_id, query=text, query_embedding=embedder.embed_query(text),
                                   embedding_model=embedder.model_name,
                                   params=replace(params, raw_exchanges=False))
    return {c.id: c.signals for c in candidates}


def build_context(
    db: Database,
    embedder: Embedder,
    *,
    system_prompt: str = "",
    also: Sequence[str] = (),
    judge: LLMRecallJudge | None = None,
    choice: BlockChoice = BlockChoice(),
    **ask: Unpack[RecallRequest],
) -> tuple[str, PromptBuild]:
    """The memory block for ``query`` and the prompt messages around it; recall failures degrade.

    The block holds only what answers (``core.block_choice``, ``choice``): the memories within the
    odds gap of the best, within the token budget. A question that gathers (``core.block_choice.gathers``:
    "how many times …", "in what order …", "summarise …") gets every memory recall finds relevant up
    to ``choice.gather_limit``, within the budget, newest first (each line dated). Ahead of them, apart, it carries the user's
    profile (``services.profile``: their standing instructions and preferences) within
    ``choice.profile_tokens``, whatever the message.

    A superseded memory (a newer one replaced it) is left out unless the query asks about the past
    (``core.query_intent.asks_about_past``) or recall is ``as_of`` a past moment.

    ``also``: more texts recalled for besides ``query`` (the proxy's follow-up read with the
    message before it, ``core.conversation_query``). They only add: ``query``'s memories keep
    their places, then come those only the others found, best score first, up to
    ``params.limit``. A ``judge`` (:func:`search_memories`) reads each memory against the text that
    found it, and only memories not found already. If recall fails (database down, embedder
    broken) the prompt is still built, without memories, and ``PromptBuild.recall_error`` says why.
    """
    # A question that gathers ("how many times …", "in what order …") gets more memories, every one
    # recall finds relevant up to the gather limit, newest first.
    shape = block_shape(ask["query"], ask["params"].limit, choice)
    limit = shape.limit

    def _recall() -> list[BlockMemory]:
        hits = search_memories(db, embedder, judge=judge, **{**ask, "params": replace(ask["params"], limit=limit)})
        # A query that filled the limit needs no help from the others (and costs no more recalls).
        full = len(hits) >= limit
        # Only what answers: the memories near the best one (the odds gap), not a fixed count.
        near = within_odds_gap([h.rank_odds for h in hits], exponent=ask["params"].relevance_exponent,
                               odds_gap=shape.choice.odds_gap)
        hits = [h for h, keep in zip(hits, near) if keep]
        found = {h.id for h in hits}
        added: dict[str, RecallHit] = {}
        for text in also if not full else ():
            # The message being answered stays ``query``: an earlier asking of it is no evidence.
            new = [h for h in search_memories(db, embedder, **{**ask, "query": text, "echo": ask["query"]})
                   if h.id not in found]
            for hit in judge.judge(text, new) if judge is not None else new:
                if hit.id not in added or hit.score > added[hit.id].score:
                    added[hit.id] = hit
        hits += sorted(added.values(), key=lambda h: h.score, reverse=True)[:max(limit - len(hits), 0)]
        if not ask.get("as_of") and not asks_about_past(ask["query"]):
            # A memory a newer one replaced is history: in the block only when history is asked for
            # (it stays in search, explain and the page, marked).
            hits = [h for h in hits if h.superseded_by is None]
        # Then the token budget, over the lines as the block shows them (the first always, cut to fit).
        kept = within_token_budget([line_tokens(h.content) for h in hits], choice.token_budget)
        if shape.newest_first:
            # Newest first: what was said last leads (a value that changed shows its current one
            # first, as everywhere else), and each line's date gives the order.
            kept = sorted(kept, key=lambda i: hits[i].occurred_at, reverse=True)
        # The user's standing instructions and preferences go first, whatever the message
        # (services.profile), within their own budget.
        profile = [BlockMemory(id=line.id, content=line.text, tier="core", occurred_at=line.said_at, kind=line.kind)
                   for line in block_profile(db, ask["user_id"], token_budget=choice.profile_tokens,
                                             as_of=ask.get("as_of"))]
        return profile + [BlockMemory(id=h.id, content=fit_text(h.content, choice.token_budget), tier=h.tier,
                                      occurred_at=h.occurred_at, superseded=h.superseded_by is not None,
                                      in_conflict=h.in_conflict, kind=h.kind)
                          for h in (hits[i] for i in kept)]

    built = build_prompt_messages(system_prompt, ask["query"], _recall)
    return built.block, built


def embed_in_batches(
    db: Database,
    embedder: Embedder,
    *,
    pending: Callable[[psycopg.Connection, int], list[tuple[str, str]]],
    store: Callable[[psycopg.Connection, dict[str, list[float]]], int],
    batch_size: int = 128,
    on_progress: Callable[[int], None] | None = None,
) -> int:
    """Embed the ``(id, text)`` rows ``pending`` locks for a batch and ``store`` their vectors, until none are left.

    Batches commit one by one, so an interrupted run keeps what it did and the next run goes
    on from there. ``on_progress`` gets the running count after each batch. Returns the count.
    """
    done = 0
    while True:
        with db.connection() as conn:
            batch = pending(conn, batch_size)
            if not batch:
                return done
            vectors = embedder.embed_documents([text for _, text in batch])
            done += store(conn, {row_id: v for (row_id, _), v in zip(batch, vectors)})
        if on_progress is not None:
            on_progress(done)


def embed_pending_exchanges(
    db: Database,
    embedder: Embedder,
    *,
    user_id: str | None = None,
    batch_size: int = 128,
    on_progress: Callable[[int], None] | None = None,
    contexts: bool = True,
) -> int:
    """Give every live exchange (of ``user_id``, or everyone) a vector of the active model, then
    (with ``contexts``) its context one (:func:`embed_pending_contexts`).

    Batches commit one by one (:func:`embed_in_batches`). Returns how many exchanges got their
    own vector.
    """
    model = embedder.model_name
    done = embed_in_batches(
        db, embedder, batch_size=batch_size, on_progress=on_progress,
        pending=lambda conn, n: exchanges_without_embedding(conn, embedding_model=model, user_id=user_id, limit=n),
        store=lambda conn, vectors: set_exchange_embeddings(conn, embedding_model=model, vectors=vectors))
    if contexts:
        embed_pending_contexts(db, embedder, user_id=user_id, batch_size=batch_size)
    return done


def embed_exchanges_now(db: Database, embedder: Embedder, memory_ids: Sequence[str]) -> int:
    """Give just-written exchanges their vectors (their own and in context) now, so recall finds them
    by meaning at once, not only by their words; how many vectors were stored.

    For single writes (the API, MCP, the proxy's turns), in the request or right after it: a
    failing embedder only logs, the write stands and the pipeline embeds the exchange later
    (:func:`embed_pending_exchanges`). A neighbour whose context the new exchange changed waits
    for the pipeline too.
    """
    ids = [str(i) for i in memory_ids]
    if not ids:
        return 0
    model = embedder.model_name
    done = 0
    try:
        for context in (False, True):
            done += embed_in_batches(
                db, embedder, batch_size=max(len(ids), 1),
                pending=lambda conn, n, context=context: exchanges_without_embedding(
                    conn, embedding_model=model, limit=n, context=context, ids=ids),
                store=lambda conn, vectors, context=context: set_exchange_embeddings(
                    conn, embedding_model=model, vectors=vectors, context=context))
    except Exception as exc:  # noqa: BLE001 - the write stands; the pipeline embeds it later
        logger.warning("could not embed %d new exchange(s) at once; the pipeline will: %s", len(ids),
                       " ".join(str(exc).split())[:200] or type(exc).__name__)
    return done


def embed_pending_contexts(db: Database, embedder: Embedder, *, user_id: str | None = None,
                           batch_size: int = 128, on_progress: Callable[[int], None] | None = None) -> int:
    """Give every live exchange whose context changed (sql/008) a vector of it read with its neighbours.

    A context changes when a neighbour arrives, moves or is forgotten, so this runs after every
    batch of new exchanges (the distillation stage calls it). Batches commit one by one
    (:func:`embed_in_batches`). Returns how many were embedded.
    """
    model = embedder.model_name
    return embed_in_batches(
        db, embedder, batch_size=batch_size, on_progress=on_progress,
        pending=lambda conn, n: exchanges_without_embedding(conn, embedding_model=model, user_id=user_id, limit=n,
                                                            context=True),
        store=lambda conn, vectors: set_exchange_embeddings(conn, embedding_model=model, vectors=vectors, context=True))


def maintain_recall_indexes(db: Database, *, min_rows: int = USER_INDEX_MIN_ROWS,
                            on_build: Callable[[str, str, str, int], None] | None = None) -> list[str]:
    """Fold BM25's statistics (``store.recall.fold_bm25_statistics``) and give every heavy user their
    own HNSW indexes (``store.user_indexes``); the names of the indexes built.

    Recall is the same without either, only slower for users with many thousands of rows
    (docs/BENCHMARKS.md): the nightly ``recall_index_job``, ``yak db index`` and the end of
    ``yak process`` run this; :func:`describe_build` words ``on_build``'s progress line. The
    builds are ``CONCURRENTLY`` (ingestion and recall go on meanwhile), which needs a connection
    outside the pool's transactions.
    """
    with connect(db.url, autocommit=True) as conn:
        folded = fold_bm25_statistics(conn)
        logger.info("folded BM25 statistics: %d delta rows fewer", folded)
        return ensure_user_indexes(conn, min_rows=min_rows, on_build=on_build)
