"""Recall for a query: embed it, run the one recall engine, attach the memories' text.

``store.recall.recall`` gathers the candidates (BM25 and vectors over distillations and their
exchanges) and ``core.recall.rank_memories`` turns them into calibrated relevance, the tier gate,
the score and the order (docs/RECALL.md). The API's context and search routes, the CLI and the
evaluation all come through :func:`search_memories`; :func:`build_context` makes the memory block
from what it finds. What a hit shows is ``services.recall_hits``'s, the LLM's optional second
opinion ``services.recall_judge``'s. Exchange vectors, of each exchange alone and read with its
neighbours (sql/008), are filled by ``services.exchange_embeddings`` (recall itself never
writes); until an exchange has them, it is found by its words and its distillation's vector only.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from functools import lru_cache, partial
from pathlib import Path
from typing import NotRequired, Protocol, TypedDict, Unpack

import psycopg

from yak_pipeline.core.block_choice import (
    BlockChoice,
    block_shape,
    fit_text,
    line_tokens,
    within_odds_gap,
    within_token_budget,
)
from yak_pipeline.core.memory_block import BlockMemory, PromptBuild, build_prompt_messages
from yak_pipeline.core.query_intent import asks_about_past, query_parts
from yak_pipeline.core.recall import RecallParams, interleave
from yak_pipeline.core.relevance import RelevanceModel, RelevanceSignals
from yak_pipeline.embeddings import Embedder
from yak_pipeline.recall_models import load_relevance_model
from yak_pipeline.services.profile import block_profile
from yak_pipeline.services.recall_hits import RecallHit, recall_hits
from yak_pipeline.services.recall_judge import LLMRecallJudge
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline.store.leg_runner import Spare
from yak_pipeline.store.recall import recall, recall_candidates

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
    """What recall's helper threads borrow their connections from (``store.leg_runner.run_legs``): up to
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


class RecallParts(Protocol):
    """What recall is scored with, given by the composition root (:class:`yak_pipeline.wiring.YakParts`
    is one: :func:`recall_params` and :func:`relevance_model` for its settings), each built when first read."""

    @property
    def embedder(self) -> Embedder: ...  # noqa: D102
    @property
    def relevance_model(self) -> RelevanceModel: ...  # noqa: D102
    def recall_params(self, *, threshold: float = ..., limit: int = ...) -> RecallParams: ...  # noqa: D102


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


def _asking(ask: RecallRequest, query: str, *, echo: str) -> RecallRequest:
    """``ask`` for another text, ``echo`` the message being answered (which stays ``ask``'s)."""
    return {**ask, "query": query, "echo": echo}


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
                       spare=spare_connections(db), **_asking(ask, part, echo=ask.get("echo") or ask["query"]))
                for part, part_vector in zip(parts, part_vectors)]
            ranked = interleave(rankings, ask["params"].limit)
        if not ranked:
            return []
        hits = recall_hits(conn, ranked, query=ask["query"],
                           now=ask.get("as_of") or ask.get("now") or datetime.now(UTC))
    return judge.judge(ask["query"], hits) if judge is not None else hits


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
        limited: RecallRequest = {**ask, "params": replace(ask["params"], limit=limit)}
        hits = search_memories(db, embedder, judge=judge, **limited)
        # A query that filled the limit needs no help from the others (and costs no more recalls).
        full = len(hits) >= limit
        # Only what answers: the memories near the best one (the odds gap), not a fixed count.
        near = within_odds_gap([h.log_rank_odds for h in hits], exponent=ask["params"].relevance_exponent,
                               odds_gap=shape.choice.odds_gap)
        hits = [h for h, keep in zip(hits, near) if keep]
        found = {h.id for h in hits}
        added: dict[str, RecallHit] = {}
        for text in also if not full else ():
            # The message being answered stays ``query``: an earlier asking of it is no evidence.
            new = [h for h in search_memories(db, embedder, **_asking(ask, text, echo=ask["query"]))
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
