"""The LLM's optional second opinion on what recall found (``YAK_RECALL_LLM_JUDGE``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from yak_pipeline.llm.errors import LLMError, reason_for_log
from yak_pipeline.llm.provider import LLMProvider
from yak_pipeline.services.recall_hits import RecallHit
from yak_pipeline.settings import Settings

logger = logging.getLogger("yak.recall")


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
