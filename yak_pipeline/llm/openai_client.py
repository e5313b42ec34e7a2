"""The LLM provider for any OpenAI-compatible chat-completions endpoint (OpenAI, Ollama, vLLM, llama.cpp …).

Every call asks for structured output with the answer's pydantic model as the JSON schema
(:func:`~yak_pipeline.llm.models.response_schema`), at temperature 0 and at most ``max_tokens``,
in the most precise form the server takes (``YAK_LLM_STRUCTURED_OUTPUT``, see
:data:`STRUCTURED_OUTPUT_LADDER`): OpenAI's ``json_schema``, else ``json_object`` with a
``schema`` (llama-cpp-python's server, which turns it into a grammar), else plain JSON mode. In
``auto`` a server that refuses one form (an HTTP 400, 422 or 500 naming ``response_format``) is
asked again in the next, and the form it took is kept for later calls.

The answer is validated with the pydantic models whatever the server promised, and the call
retries with bounded exponential back-off (``tenacity``) on what may go away by itself: transport
errors and timeouts, HTTP 429 and 5xx, and invalid output. A retry after invalid output tells
the model what was wrong with its answer and samples at :data:`RETRY_TEMPERATURE`, since asking a
local model the same question at temperature 0 gets the same broken answer. Other 4xx answers
are final. The SDK's own retries are switched off so that exactly one policy — this one — decides
how many requests a call makes: at most ``max_retries + 1`` (plus, in ``auto``, one per refused
form, once per provider).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar, get_args
from urllib.parse import urlsplit, urlunsplit

import openai
from pydantic import BaseModel
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from yak_pipeline.llm import prompts
from yak_pipeline.llm.errors import LLMError, LLMOutputError, LLMRequestRejected, LLMUnavailable, reason_for_log, redact
from yak_pipeline.llm.models import (
    ConsolidationOutput,
    ConsolidationResult,
    DistillationOutput,
    DistillationResult,
    LLMCallStats,
    ScoreOutput,
    ScoreResult,
    parse_reply,
    response_schema,
)
from yak_pipeline.settings import Settings, StructuredOutput

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)

# How much of an error body a reason quotes; the rest is noise in a log line.
_DETAIL_CHARS = 160

ResponseFormat = Literal["json_schema", "json_object_schema", "json_object"]
# The forms of structured output, most precise first; "auto" walks down this ladder.
STRUCTURED_OUTPUT_LADDER: Final[tuple[ResponseFormat, ...]] = get_args(ResponseFormat)
# A retry after invalid output samples instead of decoding greedily (module docstring).
RETRY_TEMPERATURE: Final = 0.7
# Schema names for OpenAI's json_schema form, by output model.
_SCHEMA_NAMES: Final = {DistillationOutput: "distillation", ConsolidationOutput: "consolidation",
                        ScoreOutput: "score"}


def response_format(form: ResponseFormat, model: type[BaseModel]) -> dict[str, Any]:
    """The ``response_format`` request field asking for ``model``'s schema in ``form``."""
    if form == "json_schema":
        return {"type": "json_schema",
                "json_schema": {"name": _SCHEMA_NAMES.get(model, model.__name__), "strict": True,
                                "schema": response_schema(model)}}
    if form == "json_object_schema":
        return {"type": "json_object", "schema": response_schema(model)}
    return {"type": "json_object"}


def with_rejection(messages: list[dict[str, str]], reason: str) -> list[dict[str, str]]:
    """``messages`` with the reason the previous answer was rejected put before the user message.

    The note goes first in the user message so that the JSON payload stays its last line (the
    prompts' rule: the material to judge is the last line, data, never instructions).
    """
    *head, last = messages
    note = ("Your previous answer was rejected: " + reason + ". Answer again with one JSON object that "
            "follows the rules exactly.\n\n")
    return [*head, {**last, "content": note + last["content"]}]


def _refuses_response_format(exc: openai.APIStatusError) -> bool:
    """Whether an error answer says the server does not take the ``response_format`` it was sent.

    400 and 422 are the usual refusals; llama-cpp-python 0.3 answers OpenAI's ``json_schema``
    form with a 500 whose message is the validation error on ``response_format.type``.
    """
    if exc.status_code not in (400, 422, 500):
        return False
    return "response_format" in f"{exc.message} {exc.body}"


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
class _CallState:
    """What one call has seen over its attempts.

    Token counts are summed (``None`` until an attempt reports some); ``invalid_outputs`` counts
    answers rejected as invalid, ``rejection`` is the last one's reason (told to the model on the
    next attempt), ``model`` the name of the model that last answered.
    """

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    invalid_outputs: int = 0
    rejection: str | None = None
    model: str | None = None

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
    ``structured_output`` is a form of :data:`STRUCTURED_OUTPUT_LADDER` or ``"auto"`` (module
    docstring); ``max_tokens`` bounds each answer.
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
        structured_output: StructuredOutput = "auto",
        max_tokens: int | None = None,
    ) -> None:
        if timeout_seconds <= 0:
            raise ValueError("timeout_seconds must be positive")
        if max_retries < 0:
            raise ValueError("max_retries must be 0 or more")
        if backoff_multiplier < 0 or backoff_max_seconds < 0:
            raise ValueError("back-off times must not be negative")
        if structured_output != "auto" and structured_output not in STRUCTURED_OUTPUT_LADDER:
            raise ValueError(f"structured_output must be auto or one of {', '.join(STRUCTURED_OUTPUT_LADDER)}")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError("max_tokens must be positive")
        self.base_url = base_url
        self.model = model
        self.timeout_seconds = timeout_seconds
        self.max_retries = max_retries
        self._backoff_multiplier = backoff_multiplier
        self._backoff_max_seconds = backoff_max_seconds
        self.max_tokens = max_tokens
        # The forms this provider may use, most precise first; auto drops the refused ones.
        self._forms: list[ResponseFormat] = (list(STRUCTURED_OUTPUT_LADDER) if structured_output == "auto"
                                             else [structured_output])
        self._forms_lock = threading.Lock()
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
            "structured_output": settings.llm_structured_output,
            "max_tokens": settings.llm_max_tokens,
        }
        arguments.update(overrides)
        return cls(**arguments)

    def __repr__(self) -> str:
        # Never the key: reprs end up in logs and Dagster metadata.
        return f"OpenAIChatProvider(base_url={self._shown_url!r}, model={self.model!r})"

    @property
    def structured_output(self) -> ResponseFormat:
        """The form of structured output the next call asks for first."""
        with self._forms_lock:
            return self._forms[0]

    def close(self) -> None:
        """Close the HTTP connection pool (optional; it is also released when garbage-collected)."""
        self._client.close()

    # --- the four judgements -------------------------------------------------------------

    def distill(self, exchange: str) -> DistillationResult:
        """Distil one exchange into 1–4 sentences, a confidence, a tier and a type (validated, never clamped)."""
        if not exchange.strip():
            raise ValueError("cannot distil an empty exchange")
        output, stats = self._call("distill", prompts.distill_messages(exchange), DistillationOutput)
        return DistillationResult(content=output.content, confidence=output.confidence, tier=output.tier, stats=stats,
                                  memory_type=output.type)

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
        state = _CallState()
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
                    output = self._attempt(messages, model, state)
        except LLMError as exc:
            stated = f"{task} failed after {attempts} attempt{'s' if attempts != 1 else ''}: {exc.reason}"
            counts = {"attempts": attempts, "invalid_outputs": state.invalid_outputs}
            if isinstance(exc, LLMRequestRejected):
                raise LLMRequestRejected(stated, **counts) from None
            if isinstance(exc, LLMUnavailable):
                raise LLMUnavailable(stated, retryable=exc.retryable, **counts) from None
            raise LLMOutputError(stated, **counts) from None
        latency_ms = (time.perf_counter() - started) * 1000.0
        stats = LLMCallStats(
            latency_ms=latency_ms,
            prompt_tokens=state.prompt_tokens,
            completion_tokens=state.completion_tokens,
            attempts=attempts,
            model=state.model,
            invalid_outputs=state.invalid_outputs,
        )
        logger.debug("LLM %s succeeded in %.0f ms after %d attempt(s)", task, latency_ms, attempts)
        return output, stats

    def _log_retry(self, task: str) -> Callable[[RetryCallState], None]:
        """A tenacity hook that logs each failed attempt (one line, no key) before the back-off."""

        def log(state: RetryCallState) -> None:
            """Log the failed attempt's reason and the coming wait."""
            exc = state.outcome.exception() if state.outcome is not None else None
            reason = reason_for_log(exc.reason) if isinstance(exc, LLMError) else type(exc).__name__
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

    def _attempt(self, messages: list[dict[str, str]], model: type[M], state: _CallState) -> M:
        """One request; raises LLMUnavailable / LLMRequestRejected / LLMOutputError with a one-line reason."""
        if state.rejection is not None:
            messages = with_rejection(messages, state.rejection)
        response = self._request(messages, model, temperature=0.0 if state.rejection is None else RETRY_TEMPERATURE)
        state.add(getattr(response, "usage", None))
        if isinstance(getattr(response, "model", None), str) and response.model:
            state.model = response.model
        try:
            return self._parse(response, model)
        except LLMOutputError as exc:
            state.invalid_outputs += 1
            state.rejection = exc.reason
            raise

    def _request(self, messages: list[dict[str, str]], model: type[M], *, temperature: float) -> Any:
        """Send one chat completion in the first form of structured output the server takes.

        A server that refuses a form is asked in the next one (``auto`` only); the form it took
        becomes this provider's first, so the refusal costs one request per provider, not per call.
        """
        with self._forms_lock:
            forms = list(self._forms)
        for index, form in enumerate(forms):
            extra: dict[str, Any] = {} if self.max_tokens is None else {"max_tokens": self.max_tokens}
            try:
                # The stubs' overloads take neither argument as sent: plain dicts are the wire
                # format of messages, and response_format's json_object form carries a schema (an
                # extension of llama.cpp's and vLLM's servers that OpenAI's types do not list).
                response = self._client.chat.completions.create(  # type: ignore[call-overload]
                    model=self.model,
                    messages=messages,
                    temperature=temperature,
                    response_format=response_format(form, model),
                    **extra,
                )
            except openai.APITimeoutError:
                raise LLMUnavailable(f"no reply from {self._shown_url} within {self.timeout_seconds:g} s") from None
            except openai.APIConnectionError as exc:
                cause = exc.__cause__ or exc
                detail = redact(f"{type(cause).__name__}: {cause}", self._api_key)[:_DETAIL_CHARS]
                raise LLMUnavailable(f"cannot reach {self._shown_url} ({detail})") from None
            except openai.APIStatusError as exc:
                if index + 1 < len(forms) and _refuses_response_format(exc):
                    logger.info("%s refuses response_format %s (HTTP %d); asking with %s", self._shown_url, form,
                                exc.status_code, forms[index + 1])
                    continue
                raise self._status_error(exc) from None
            except openai.APIResponseValidationError as exc:
                raise LLMOutputError(f"the endpoint's response is not a chat completion: {exc.message}") from None
            except openai.OpenAIError as exc:  # anything else the SDK may raise: report it, do not retry
                raise LLMRequestRejected(redact(f"{type(exc).__name__}: {exc}", self._api_key)) from None
            if index:
                with self._forms_lock:
                    if form in self._forms:
                        self._forms = self._forms[self._forms.index(form):]
            return response
        raise AssertionError("unreachable: the last form's refusal is raised above")  # pragma: no cover

    @staticmethod
    def _parse(response: Any, model: type[M]) -> M:
        """The validated answer of a chat completion; LLMOutputError with a one-line reason otherwise."""
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
