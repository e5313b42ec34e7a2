"""How an evaluation run is set up: its options, its data files, the distiller and progress lines."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from yak_pipeline.core.relevance import RelevanceModel
from yak_pipeline.eval.locomo import Conversation
from yak_pipeline.settings import Settings

# Where a long run reports what it is doing, one line at a time (the CLI prints them on stderr).
Progress = Callable[[str], None]
# What distils the exchanges: the offline rules provider, nothing, the packaged local model, or
# the configured endpoint (YAK_LLM_BASE_URL; the default when it is set).
Distiller = Literal["rules", "none", "local", "llm"]
DISTILLERS: tuple[str, ...] = ("rules", "none", "local", "llm")
# A data file's label and its conversations.
Dataset = tuple[str, Sequence[Conversation]]
DEFAULT_FOLDS = 5


@dataclass(frozen=True)
class EvalOptions:
    """How to run the evaluation (the ``yak eval locomo`` options)."""

    ks: tuple[int, ...] = (1, 5, 10)
    threshold: float = 0.7
    ablations: bool = False
    keep_database: bool = False
    # The bar of the target line: default Recall@k over the better baseline, in points.
    required_points: float = 5.0
    # A relevance model to evaluate as "Yak (shipped model)" instead of the configured embedder's.
    model: RelevanceModel | None = None
    # Also run "Yak + LLM judge": the cross-validated recall, then the configured LLM's judgement
    # (services.recall_judge.LLMRecallJudge, YAK_RECALL_LLM_JUDGE); needs YAK_LLM_BASE_URL.
    llm_judge: bool = False
    # What distils (DISTILLERS); None: "llm" when YAK_LLM_BASE_URL is set, else "rules". "local"
    # expects the settings to point at the packaged local model already (cli.eval starts it).
    distiller: str | None = None
    # Conversation-level folds of the cross-validation (at most one per conversation).
    folds: int = DEFAULT_FOLDS


def quiet(_: str) -> None:
    """A progress sink that drops every line."""


def resolve_distiller(settings: Settings, distiller: str | None) -> str:
    """The distiller to use: as asked, or ``llm`` when ``YAK_LLM_BASE_URL`` is set, else ``rules``."""
    if distiller is None:
        return "llm" if settings.llm_base_url else "rules"
    if distiller not in DISTILLERS:
        raise ValueError(f"unknown distiller {distiller!r}: use one of rules, none, local")
    if distiller in ("local", "llm") and not settings.llm_base_url:
        raise ValueError(f"the {distiller} distiller needs an LLM endpoint (YAK_LLM_BASE_URL or --distiller local)")
    return distiller
