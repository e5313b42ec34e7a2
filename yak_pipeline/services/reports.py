"""What a pipeline stage did, in numbers, for asset metadata and ``yak process`` output."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from yak_pipeline.llm.models import LLMCallStats


@dataclass
class StageReport:
    """Counts and LLM call statistics of one stage over one partition."""

    rows_in: int = 0
    rows_out: int = 0
    flagged: int = 0
    failed: int = 0
    skipped: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tokens_reported: bool = False
    errors: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)

    def record_call(self, stats: LLMCallStats) -> None:
        """Add one LLM call's latency and token usage."""
        self.latencies_ms.append(stats.latency_ms)
        if stats.prompt_tokens is not None or stats.completion_tokens is not None:
            self.tokens_reported = True
            self.prompt_tokens += stats.prompt_tokens or 0
            self.completion_tokens += stats.completion_tokens or 0

    def merge(self, other: StageReport) -> None:
        """Fold another report (e.g. one worker's) into this one."""
        for name in ("rows_in", "rows_out", "flagged", "failed", "skipped", "prompt_tokens", "completion_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.tokens_reported = self.tokens_reported or other.tokens_reported
        self.latencies_ms.extend(other.latencies_ms)
        self.errors.extend(other.errors)
        self.ids.extend(other.ids)

    def metadata(self) -> dict[str, float | int | str]:
        """Flat metadata for Dagster's UI and JSON output."""
        data: dict[str, float | int | str] = {
            "rows_in": self.rows_in, "rows_out": self.rows_out, "flagged": self.flagged,
            "failed": self.failed, "skipped": self.skipped, "llm_calls": len(self.latencies_ms),
        }
        if self.latencies_ms:
            data["llm_latency_p50_ms"] = round(float(np.percentile(self.latencies_ms, 50)), 1)
            data["llm_latency_p95_ms"] = round(float(np.percentile(self.latencies_ms, 95)), 1)
        if self.tokens_reported:
            data["prompt_tokens"] = self.prompt_tokens
            data["completion_tokens"] = self.completion_tokens
        if self.errors:
            data["first_error"] = self.errors[0][:300]
        return data
