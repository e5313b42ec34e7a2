"""The LLM provider protocol: the four judgements Yak asks of a language model.

Two implementations exist: :class:`~yak_pipeline.llm.openai_client.OpenAIChatProvider` (any
OpenAI-compatible endpoint) and :class:`~yak_pipeline.llm.rules.RulesProvider` (deterministic,
offline stand-in). Callers depend on this protocol only, and run its methods concurrently from
several threads, so implementations must be thread-safe.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from yak_pipeline.llm.models import ConsolidationResult, DistillationResult, ScoreResult


@runtime_checkable
class LLMProvider(Protocol):
    """Distils, consolidates and judges memories; every method is thread-safe.

    Methods return validated results (see :mod:`yak_pipeline.llm.models`) or raise
    :class:`~yak_pipeline.llm.errors.LLMUnavailable` / :class:`~yak_pipeline.llm.errors.LLMOutputError`
    with a one-line reason; they never return an invalid or clamped value.
    """

    name: str
    """Short provider name stored with results and shown in logs (``"rules"``, ``"openai"``)."""

    def distill(self, exchange: str) -> DistillationResult:
        """Distil one exchange ("User: …\\nAssistant: …") into 1–4 sentences, a confidence and a tier."""
        ...

    def consolidate(self, older: str, newer: str) -> ConsolidationResult:
        """Merge two near-duplicate memories into one text of 1–4 sentences; the newer wins disagreements."""
        ...

    def conflict_score(self, a: str, b: str) -> ScoreResult:
        """How strongly two memories contradict each other, in [0, 1]."""
        ...

    def relevance_score(self, memory: str, context: str) -> ScoreResult:
        """How useful ``memory`` was for the turn ``context``, in [0, 1]."""
        ...
