"""The catalogue of every Prometheus metric Yak exposes: DESIGN §6's ten and the memory proxy's,
MCP server's and secret redaction's (issues 13, 34): name, type, help, label names, the label
values shown before any event, and a histogram's buckets.

Everything that counts or serves a metric reads it from here: the store appends and folds events
(:mod:`yak_pipeline.store.metrics`), the API buffers them and renders ``/metrics``
(:mod:`yak_pipeline.api.metrics`). A metric not in :data:`METRICS` cannot be counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from yak_pipeline.core.secrets import SECRET_KINDS

MetricKind = Literal["counter", "histogram", "gauge"]


@dataclass(frozen=True)
class MetricDefinition:
    """One metric as ``/metrics`` shows it.

    ``labels`` are its label names (none: one unlabelled series); ``known`` are label values
    exposed at 0 from a fresh server's first scrape, because a family without samples is
    "absent" to Prometheus, which breaks dashboards and ``absent()`` alerts until its first
    event; ``buckets`` are a histogram's upper bounds (the +Inf bucket is implied).
    """

    name: str
    kind: MetricKind
    help: str
    labels: tuple[str, ...] = ()
    known: tuple[tuple[str, ...], ...] = ()
    buckets: tuple[float, ...] = ()

    @property
    def known_label_values(self) -> tuple[dict[str, str], ...]:
        """:attr:`known` as label name → value mappings."""
        return tuple(dict(zip(self.labels, values, strict=True)) for values in self.known)


def _each(values: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """One known series per value of a metric's single label."""
    return tuple((value,) for value in values)


# Latency buckets in milliseconds: recall is a database query (ms), distillation an LLM call (s).
RECALL_BUCKETS_MS: Final = (1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0)
DISTILLATION_BUCKETS_MS: Final = (50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0,
                                  60000.0, 120000.0)

# Error types shown (at 0) before any happened, so dashboards and alerts have series to watch.
KNOWN_ERROR_TYPES: Final = ("distillation_failed", "embedding_failed", "warmth_failed", "db_connection_lost",
                            "llm_unavailable", "internal")
# Why a proxy request got less than recall → answer → stored turn; shown at 0 like the errors.
KNOWN_DEGRADATIONS: Final = ("recall_failed", "upstream_cut", "turn_not_stored")
# The queues yak_queue_size reports, always both.
QUEUES: Final = ("memories", "turns")
# Reasons are the CHECK lists of distillation_versions.reason (less 'distilled', the first text,
# counted as created) and warmth_events.reason (001_schema.sql).
VERSION_REASONS: Final = ("merged", "redistilled", "manual", "restored")
WARMTH_REASONS: Final = ("turn", "nightly", "manual", "reset", "forgotten")

METRICS: Final[tuple[MetricDefinition, ...]] = (
    MetricDefinition("yak_requests_total", "counter", "HTTP API requests, by method, route and status code.",
                     ("method", "route", "status"),
                     # Every route is too many series to invent; the scrape's own series is the one sure to come.
                     (("GET", "/metrics", "200"),)),
    MetricDefinition("yak_distillations_created", "counter", "Distillations created from exchanges."),
    MetricDefinition("yak_distillations_versioned", "counter",
                     "New versions of distillations (merged, re-distilled, manual), by reason.",
                     ("reason",), _each(VERSION_REASONS)),
    MetricDefinition("yak_memories_deleted", "counter", "Memories forgotten (hard or soft delete)."),
    MetricDefinition("yak_recall_latency_ms", "histogram", "Time to recall memories for a query, in ms.",
                     buckets=RECALL_BUCKETS_MS),
    MetricDefinition("yak_distillation_latency_ms", "histogram",
                     "Time to distil one exchange (LLM call and embedding), in ms.", buckets=DISTILLATION_BUCKETS_MS),
    MetricDefinition("yak_queue_size", "gauge", "Items waiting for the pipeline, by queue (memories, turns).",
                     ("queue",), _each(QUEUES)),
    MetricDefinition("yak_warmth_updates", "counter", "Warmth evaluations and resets, by reason.",
                     ("reason",), _each(WARMTH_REASONS)),
    MetricDefinition("yak_conflicts_detected", "counter", "Contradictions detected between distillations."),
    MetricDefinition("yak_errors_total", "counter", "Errors, by type.", ("type",), _each(KNOWN_ERROR_TYPES)),
    MetricDefinition("yak_proxy_requests_total", "counter",
                     "Chat completions through the memory proxy, by outcome and whether streamed.",
                     ("outcome", "stream")),
    MetricDefinition("yak_proxy_memories_injected", "counter",
                     "Memories the memory proxy put into prompts' memory blocks."),
    MetricDefinition("yak_proxy_degradations_total", "counter",
                     "Memory proxy requests served with less than the full loop, by reason.",
                     ("reason",), _each(KNOWN_DEGRADATIONS)),
    MetricDefinition("yak_mcp_tool_calls_total", "counter", "MCP tool calls (yak mcp), by tool and outcome.",
                     ("tool", "outcome")),
    MetricDefinition("yak_secrets_redacted_total", "counter",
                     "Secrets replaced by a placeholder before a text was stored, by kind (core/secrets.py).",
                     ("kind",), _each(SECRET_KINDS)),
)
METRICS_BY_NAME: Final[dict[str, MetricDefinition]] = {m.name: m for m in METRICS}
