"""Each method's ranking of one asked question, from what the collection pass kept.

The baselines' rankings were kept as they were asked. A Yak method re-ranks the collected
candidates with ``core.recall.rank_memories`` (what ``store.recall.recall`` does) and the model
its role names (:class:`RunModels`); an ablation runs the live recall instead, since its
parameters can change the candidates; "Yak + LLM judge" lets the LLM drop what it judges
irrelevant from the cross-validated ranking.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from yak_pipeline.core.query_intent import asks_about_past, asks_about_present
from yak_pipeline.core.recall import RankedMemory, RecallParams, interleave, rank_memories
from yak_pipeline.core.relevance import RelevanceModel
from yak_pipeline.embeddings import Embedder
from yak_pipeline.eval.collection import AskedQuestion, CollectedFile, candidate_turns
from yak_pipeline.eval.cross_validation import CrossValidation
from yak_pipeline.eval.methods import Method, ModelRole
from yak_pipeline.services.recall_hits import recall_hits
from yak_pipeline.services.recall_judge import LLMRecallJudge
from yak_pipeline.store.recall import recall


def _rank(asked: AskedQuestion, model: RelevanceModel, params: RecallParams) -> list[RankedMemory]:
    """Yak's ranking of the collected candidates with ``model`` (what ``services.recall.search_memories``
    does: ``store.recall.recall`` of the question, and of each thing it lists, interleaved)."""
    question = asked.question.question
    about_present, about_past = asks_about_present(question), asks_about_past(question)
    rankings = [rank_memories(candidates, model=model, params=params, now=asked.conversation.now,
                              about_present=about_present, about_past=about_past)
                for candidates in [asked.candidates, *(asked.part_candidates if params.query_parts else [])]]
    return rankings[0] if len(rankings) == 1 else interleave(rankings, params.limit)


def hit_texts(conn: Any, ranked: Sequence[RankedMemory]) -> list[str]:
    """What each ranked memory says, as the block shows it (``services.recall_hits.recall_hits``: a
    distillation's text, a raw exchange's user side); "" for one that is gone."""
    shown = {(h.ranked.kind, h.ranked.id): h.content for h in recall_hits(conn, ranked)}
    return [shown.get((r.kind, r.id), "") for r in ranked]


@dataclass
class RunModels:
    """The relevance models of a run."""

    shipped: RelevanceModel
    in_sample: RelevanceModel | None
    cross_validation: CrossValidation | None

    def for_role(self, role: ModelRole, key: str) -> RelevanceModel | None:
        """The model that ranks conversation ``key`` for a method of ``role`` (None: the in-sample fit failed)."""
        if role == "shipped":
            return self.shipped
        if role == "in_sample":
            return self.in_sample
        if self.cross_validation is not None:
            return self.cross_validation.model_for(key)
        return self.in_sample or self.shipped


def ranked_items(method: Method, asked: AskedQuestion, collected: CollectedFile, models: RunModels,
                 embedder: Embedder, judge: LLMRecallJudge | None) -> tuple[list[frozenset[str]], float, list[RankedMemory] | None] | None:
    """One method's ranked items for one asked question (each the turns it holds), its time in ms
    and (a Yak method) the ranked memories; None when the method has no model (an in-sample fit
    that failed)."""
    if method.kind in ("bm25", "dense"):
        return asked.baselines[method.name], asked.baselines_ms[method.name], None
    model = models.for_role(method.model, asked.conversation.key)
    if model is None:
        return None
    assert method.params is not None
    conversation = asked.conversation
    if method.live:
        with collected.db.connection() as conn:
            began = time.perf_counter()
            ranked = recall(conn, user_id=conversation.user_id, query=asked.question.question,
                            query_embedding=asked.vector, embedding_model=embedder.model_name,
                            params=method.params, model=model, now=conversation.now)
            ms = (time.perf_counter() - began) * 1000
            held = {**asked.held, **candidate_turns(conn, conversation, [r for r in ranked
                                                                          if (r.kind, r.id) not in asked.held])}
        return [held.get((r.kind, r.id), frozenset()) for r in ranked], ms, ranked
    began = time.perf_counter()
    ranked = _rank(asked, model, method.params)
    ms = asked.candidates_ms + (time.perf_counter() - began) * 1000
    if method.kind == "yak_judged" and judge is not None and ranked:
        with collected.db.connection() as conn:
            kept = judge.kept(asked.question.question, hit_texts(conn, ranked))
        if kept is not None:
            ranked = [ranked[i] for i, _ in kept]
    return [asked.held.get((r.kind, r.id), frozenset()) for r in ranked], ms, ranked
