"""The LLM provider for any OpenAI-compatible chat-completions endpoint (OpenAI, Ollama, vLLM, llama.cpp …).

Every call asks for a JSON object (``response_format={"type": "json_object"}``, temperature 0),
validates the answer with the pydantic models, and retries with bounded exponential back-off
(``tenacity``) on what may go away by itself: transport errors and timeouts, HTTP 429 and 5xx,
and invalid output (a second sample often fixes a broken JSON). Other 4xx answers are final.
The SDK's own retries are switched off so that exactly one policy — this one — decides how many
requests a call makes: at most ``max_retries + 1``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import openai
from pydantic import BaseModel
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from yak_pipeline.llm import prompts
from yak_pipeline.llm.errors import LLMError, LLMOutputError, LLMRequestRejected, LLMUnavailable, redact
from yak_pipeline.llm.models import (
    ConsolidationOutput,
    ConsolidationResult,
    DistillationOutput,
    DistillationResult,
    LLMCallStats,
    ScoreOutput,
    ScoreResult,
    parse_reply,
)
from yak_pipeline.settings import Settings

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

# How much of an error body a reason quotes; the rest is noise in a log line.
_DETAIL_CHARS = 160


def _safe_url(url: str) -> str:
    """``url`` without any ``user:password@`` part, for messages."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def _should_retry(exc: BaseException) -> bool:
    """Invalid output and transient unavailability are retried; a rejected request is not."""
    if isinstance(exc, LLMOutputError):
        return True
    return isinstance(exc, LLMUnavailable) and exc.retryable


@dataclass
class _Usage:
    """Token counts summed over the attempts of one call (``None`` until an attempt reports some)."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def add(self, usage: Any) -> None:
        """Add one response's ``usage`` (which local endpoints often leave out)."""
        if usage is None:
            return
        prompt = getattr(usage, "prompt_tokens", None)
        completion = getattr(usage, "completion_tokens", None)
        if isinstance(prompt, int):
            self.prompt_tokens = (self.prompt_tokens or 0) + prompt
        if isinstance(completion, int):
            self.completion_tokens = (self.completion_tokens or 0) + completion


class OpenAIChatProvider:
    """:class:`~yak_pipeline.llm.provider.LLMProvider` backed by an OpenAI-compatible endpoint.

    Thread-safe: the underlying ``openai.OpenAI`` client (an ``httpx`` connection pool) may be
    shared between threads, and each call keeps its retry state and counters to itself.

    ``backoff_multiplier`` and ``backoff_max_seconds`` shape the wait between attempts
    (``multiplier × 2^(attempt−1)`` seconds, at most ``backoff_max_seconds``); tests shrink them.
    """

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_seconds: float = 60.0,
        max_retries: int = 3,
        *,
        backoff_multiplier: float = 0.2,
        backoff_max_seconds: float = 5.0,
    ) -> None:
        if timeout_seconds <= 0:
            raise ValueError("timeout_seconds must be positive")
        if max_retries < 0:
            raise ValueError("max_retries must be 0 or more")
        if backoff_multiplier < 0 or backoff_max_seconds < 0:
            raise ValueError("back-off times must not be negative")
        self.base_url = base_url
        self.model = model
        self.timeout_seconds = timeout_seconds
        self.max_retries = max_retries
        self._backoff_multiplier = backoff_multiplier
        self._backoff_max_seconds = backoff_max_seconds
        self._api_key = api_key
        self._shown_url = _safe_url(base_url)
        # Many local servers need no key, but the SDK insists on one; the placeholder is harmless.
        self._client = openai.OpenAI(
            base_url=base_url, api_key=api_key or "not-needed", timeout=timeout_seconds, max_retries=0
        )

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> OpenAIChatProvider:
        """A provider for ``YAK_LLM_BASE_URL`` / ``YAK_LLM_MODEL`` / ``YAK_LLM_API_KEY`` and the timeout and retry settings.

        ``overrides`` are passed to the constructor (e.g. back-off timings).
        """
        if not settings.llm_base_url:
            raise ValueError("YAK_LLM_BASE_URL is not set")
        key = settings.llm_api_key.get_secret_value() if settings.llm_api_key is not None else None
        arguments: dict[str, Any] = {
            "base_url": settings.llm_base_url,
            "model": settings.llm_model,
            "api_key": key,
            "timeout_seconds": settings.llm_timeout_seconds,
            "max_retries": settings.llm_max_retries,
        }
        arguments.update(overrides)
        return cls(**arguments)

    def __repr__(self) -> str:
        # Never the key: reprs end up in logs and Dagster metadata.
        return f"OpenAIChatProvider(base_url={self._shown_url!r}, model={self.model!r})"

    def close(self) -> None:
        """Close the HTTP connection pool (optional; it is also released when garbage-collected)."""
        self._client.close()

    # --- the four judgements -------------------------------------------------------------

    def distill(self, exchange: str) -> DistillationResult:
        """Distil one exchange into 1–4 sentences, a confidence and a tier (validated, never clamped)."""
        if not exchange.strip():
            raise ValueError("cannot distil an empty exchange")
        output, stats = self._call("distill", prompts.distill_messages(exchange), DistillationOutput)
        return DistillationResult(content=output.content, confidence=output.confidence, tier=output.tier, stats=stats)

    def consolidate(self, older: str, newer: str) -> ConsolidationResult:
        """Merge two near-duplicate memories into one text of 1–4 sentences."""
        output, stats = self._call("consolidate", prompts.consolidate_messages(older, newer), ConsolidationOutput)
        return ConsolidationResult(content=output.content, stats=stats)

    def conflict_score(self, a: str, b: str) -> ScoreResult:
        """How strongly two memories contradict each other, in [0, 1]."""
        output, stats = self._call("conflict", prompts.conflict_messages(a, b), ScoreOutput)
        return ScoreResult(score=output.score, stats=stats)

    def relevance_score(self, memory: str, context: str) -> ScoreResult:
        """How useful ``memory`` was for the turn ``context``, in [0, 1]."""
        output, stats = self._call("relevance", prompts.relevance_messages(memory, context), ScoreOutput)
        return ScoreResult(score=output.score, stats=stats)

    # --- one call: attempts, retries, stats ----------------------------------------------

    def _call(self, task: str, messages: list[dict[str, str]], model: type[M]) -> tuple[M, LLMCallStats]:
        """Run attempts until one returns valid output or the retry policy gives up."""
        started = time.perf_counter()
        usage = _Usage()
        attempts = 0
        # A fresh Retrying per call: its state is per call, so concurrent calls never share it.
        retrying = Retrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=wait_exponential(multiplier=self._backoff_multiplier, max=self._backoff_max_seconds),
            retry=retry_if_exception(_should_retry),
            before_sleep=self._log_retry(task),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    attempts = attempt.retry_state.attempt_number
                    output = self._attempt(messages, model, usage)
        except LLMError as exc:
            stated = f"{task} failed after {attempts} attempt{'s' if attempts != 1 else ''}: {exc.reason}"
            if isinstance(exc, LLMRequestRejected):
                raise LLMRequestRejected(stated, attempts=attempts) from None
            if isinstance(exc, LLMUnavailable):
                raise LLMUnavailable(stated, attempts=attempts, retryable=exc.retryable) from None
            raise LLMOutputError(stated, attempts=attempts) from None
        latency_ms = (time.perf_counter() - started) * 1000.0
        stats = LLMCallStats(
            latency_ms=latency_ms,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            attempts=attempts,
        )
        logger.debug("LLM %s succeeded in %.0f ms after %d attempt(s)", task, latency_ms, attempts)
        return output, stats

    def _log_retry(self, task: str) -> Callable[[RetryCallState], None]:
        """A tenacity hook that logs each failed attempt (one line, no key) before the back-off."""

        def log(state: RetryCallState) -> None:
            """Log the failed attempt's reason and the coming wait."""
            exc = state.outcome.exception() if state.outcome is not None else None
            reason = exc.reason if isinstance(exc, LLMError) else repr(exc)
            wait = state.next_action.sleep if state.next_action is not None else 0.0
            logger.warning(
                "LLM %s attempt %d/%d failed (%s); retrying in %.2f s",
                task,
                state.attempt_number,
                self.max_retries + 1,
                reason,
                wait,
            )

        return log

    def _attempt(self, messages: list[dict[str, str]], model: type[M], usage: _Usage) -> M:
        """One request; raises LLMUnavailable / LLMRequestRejected / LLMOutputError with a one-line reason."""
        try:
            response = self._client.chat.completions.create(
                model=self.model,
                messages=messages,  # type: ignore[arg-type]  # plain dicts are the wire format
                temperature=0,
                response_format={"type": "json_object"},
            )
        except openai.APITimeoutError:
            raise LLMUnavailable(f"no reply from {self._shown_url} within {self.timeout_seconds:g} s") from None
        except openai.APIConnectionError as exc:
            cause = exc.__cause__ or exc
            detail = redact(f"{type(cause).__name__}: {cause}", self._api_key)[:_DETAIL_CHARS]
            raise LLMUnavailable(f"cannot reach {self._shown_url} ({detail})") from None
        except openai.APIStatusError as exc:
            raise self._status_error(exc) from None
        except openai.APIResponseValidationError as exc:
            raise LLMOutputError(f"the endpoint's response is not a chat completion: {exc.message}") from None
        except openai.OpenAIError as exc:  # anything else the SDK may raise: report it, do not retry
            raise LLMRequestRejected(redact(f"{type(exc).__name__}: {exc}", self._api_key)) from None

        usage.add(getattr(response, "usage", None))
        choices = getattr(response, "choices", None)
        if not choices:
            raise LLMOutputError("the response has no choices")
        choice = choices[0]
        message = getattr(choice, "message", None)
        content = getattr(message, "content", None)
        if content is not None and not isinstance(content, str):
            raise LLMOutputError(f"the reply's content is a {type(content).__name__}, not text")
        try:
            return parse_reply(content, model)
        except LLMOutputError as exc:
            # A reply cut off by the token limit explains a broken JSON better than the JSON error does.
            if getattr(choice, "finish_reason", None) == "length":
                raise LLMOutputError(f"reply truncated at the token limit; {exc.reason}") from None
            raise

    def _status_error(self, exc: openai.APIStatusError) -> LLMUnavailable:
        """Classify an HTTP error answer: 408/429/5xx are transient, other 4xx are final."""
        status = exc.status_code
        detail = exc.message
        body = exc.body
        if isinstance(body, dict):
            error = body.get("error", body)
            if isinstance(error, dict) and isinstance(error.get("message"), str):
                detail = error["message"]
            elif isinstance(error, str):
                detail = error
        detail = redact(" ".join(str(detail).split()), self._api_key)[:_DETAIL_CHARS]
        reason = f"HTTP {status} from {self._shown_url}: {detail}"
        if status in (408, 429) or status >= 500:
            return LLMUnavailable(reason, retryable=True)
        return LLMRequestRejected(f"{reason} (not retried)")
