"""Yak's LLM layer: prompts, strict output models, an OpenAI-compatible provider and an offline stand-in.

:func:`get_llm_provider` picks the provider from settings: the OpenAI-compatible one when
``YAK_LLM_BASE_URL`` is set, else the deterministic :class:`RulesProvider`, which says so in the log.
This layer only produces validated output; gating by confidence happens in ``core``. The output
models and what providers hand back live in :mod:`yak_pipeline.llm.models`.
"""

from __future__ import annotations

import logging
import threading

from yak_pipeline.llm.errors import LLMError, LLMOutputError, LLMRequestRejected, LLMUnavailable
from yak_pipeline.llm.openai_client import OpenAIChatProvider
from yak_pipeline.llm.prompts import OUTPUT_SCHEMA_VERSION, current_prompt_version
from yak_pipeline.llm.provider import LLMProvider
from yak_pipeline.llm.rules import RulesProvider
from yak_pipeline.settings import Settings

__all__ = [
    "OUTPUT_SCHEMA_VERSION",
    "LLMError",
    "LLMOutputError",
    "LLMProvider",
    "LLMRequestRejected",
    "LLMUnavailable",
    "OpenAIChatProvider",
    "RulesProvider",
    "current_prompt_version",
    "get_llm_provider",
]

logger = logging.getLogger(__name__)

RULES_NOTICE = (
    "YAK_LLM_BASE_URL is unset: the offline rules provider stands in for the LLM "
    "(deterministic heuristics; set YAK_LLM_BASE_URL to an OpenAI-compatible endpoint for real distillation)"
)

# Said once per process: every asset run and API request asks for a provider.
_notice_lock = threading.Lock()
_notice_logged = False


def _announce_rules_provider() -> None:
    """Log :data:`RULES_NOTICE` at INFO, the first time only."""
    global _notice_logged
    with _notice_lock:
        if _notice_logged:
            return
        _notice_logged = True
    logger.info(RULES_NOTICE)


def get_llm_provider(settings: Settings) -> LLMProvider:
    """The configured provider: OpenAI-compatible when ``YAK_LLM_BASE_URL`` is set, else the rules stand-in."""
    if settings.llm_base_url:
        return OpenAIChatProvider.from_settings(settings)
    _announce_rules_provider()
    return RulesProvider()
