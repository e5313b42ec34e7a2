"""What a pipeline stage did, in numbers, for asset metadata and ``yak process`` output."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from yak_pipeline.llm.errors import LLMError
from yak_pipeline.llm.models import LLMCallStats


@dataclass
class StageReport:
    """Counts and LLM call statistics of one stage over one partition.

    Per LLM call: its latency, tokens, requests and invalid answers, and the model that answered
    (``models`` counts calls by model name). A call that gave up counts its requests and invalid
    answers too (:meth:`record_failed_call`): a real model's malformed answers are never hidden
    by the retry that fixed them or by the memory kept pending.
    """

    rows_in: int = 0
    rows_out: int = 0
    flagged: int = 0
    failed: int = 0
    skipped: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tokens_reported: bool = False
    llm_requests: int = 0
    invalid_outputs: int = 0
    failed_calls: int = 0
    models: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)

    def record_call(self, stats: LLMCallStats) -> None:
        """Add one successful LLM call: latency, token usage, requests, invalid answers, model."""
        self.latencies_ms.append(stats.latency_ms)
        self.llm_requests += stats.attempts
        self.invalid_outputs += stats.invalid_outputs
        if stats.model:
            self.models[stats.model] += 1
        if stats.prompt_tokens is not None or stats.completion_tokens is not None:
            self.tokens_reported = True
            self.prompt_tokens += stats.prompt_tokens or 0
            self.completion_tokens += stats.completion_tokens or 0

    def record_failed_call(self, exc: LLMError) -> None:
        """Add one LLM call that gave up: its requests and invalid answers, as far as known."""
        self.failed_calls += 1
        self.llm_requests += exc.attempts or 0
        self.invalid_outputs += exc.invalid_outputs or 0

    @property
    def valid_output_rate(self) -> float | None:
        """Share of the LLM's answers that were valid output (None before any answer).

        Answers are requests that were answered: successful calls' last requests plus every
        invalid one; transport errors and HTTP errors are no answers.
        """
        answers = len(self.latencies_ms) + self.invalid_outputs
        return None if answers == 0 else len(self.latencies_ms) / answers

    def merge(self, other: StageReport) -> None:
        """Fold another report (e.g. one worker's) into this one."""
        for name in ("rows_in", "rows_out", "flagged", "failed", "skipped", "prompt_tokens", "completion_tokens",
                     "llm_requests", "invalid_outputs", "failed_calls"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.tokens_reported = self.tokens_reported or other.tokens_reported
        self.models.update(other.models)
        self.latencies_ms.extend(other.latencies_ms)
        self.errors.extend(other.errors)
        self.ids.extend(other.ids)

    def metadata(self) -> dict[str, float | int | str]:
        """Flat metadata for Dagster's UI and JSON output."""
        data: dict[str, float | int | str] = {
            "rows_in": self.rows_in, "rows_out": self.rows_out, "flagged": self.flagged,
            "failed": self.failed, "skipped": self.skipped, "llm_calls": len(self.latencies_ms),
        }
        if self.llm_requests:
            data["llm_requests"] = self.llm_requests
            data["llm_invalid_outputs"] = self.invalid_outputs
            data["llm_failed_calls"] = self.failed_calls
        if self.valid_output_rate is not None:
            data["llm_valid_output_rate"] = round(self.valid_output_rate, 3)
        if self.models:
            data["llm_models"] = ", ".join(f"{name} ({count})" for name, count in self.models.most_common())
        if self.latencies_ms:
            data["llm_latency_p50_ms"] = round(float(np.percentile(self.latencies_ms, 50)), 1)
            data["llm_latency_p95_ms"] = round(float(np.percentile(self.latencies_ms, 95)), 1)
        if self.tokens_reported:
            data["prompt_tokens"] = self.prompt_tokens
            data["completion_tokens"] = self.completion_tokens
        if self.errors:
            data["first_error"] = self.errors[0][:300]
        return data
