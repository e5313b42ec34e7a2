"""Ingesting a data file's conversations into a scratch database through the real pipeline.

Each conversation is one user. Its exchanges (``eval.locomo``: a user turn and the assistant's
reply as one exchange where the second speaker is an assistant, else one exchange per turn) go
through the pipeline's own functions: ``ingest_records`` (dated by the session), then, unless the
distiller is ``none``, ``distill_memories`` with the chosen provider, the confidence gate,
``score_conflicts`` and ``merge_near_duplicates``; finally every exchange gets its vector and its
context vector (``embed_pending_exchanges``), as recall's exchange legs need. What comes back says
which turns each stored memory holds, so any ranking can be scored against evidence turns.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from yak_pipeline.alerts import NULL_ALERTER
from yak_pipeline.core.exchanges import content_sha256, normalise_exchange_text
from yak_pipeline.core.secrets import redact_secrets
from yak_pipeline.embeddings import Embedder
from yak_pipeline.eval.locomo import Conversation
from yak_pipeline.eval.metrics import percentile
from yak_pipeline.eval.options import Progress
from yak_pipeline.ingestion.formats.exchange_records import ExchangeRecord
from yak_pipeline.ingestion.records import ingest_records
from yak_pipeline.llm import RulesProvider
from yak_pipeline.llm.provider import LLMProvider
from yak_pipeline.services.consolidate import ConsolidateJob, merge_near_duplicates, score_conflicts
from yak_pipeline.services.distill import DistillJob, distill_memories, partition_memory_ids
from yak_pipeline.services.exchange_embeddings import embed_pending_exchanges
from yak_pipeline.services.reports import StageReport
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline.store.distillations import status_counts
from yak_pipeline.store.memories import list_memories
from yak_pipeline.wiring import YakParts, parts_of

_DISTIL_CHUNK = 100
_USER_ID_UNSAFE = re.compile(r"[^A-Za-z0-9._@-]+")


@dataclass
class IngestedConversation:
    """A conversation as ingested: its user, its clock, and which turns each memory holds."""

    source: Conversation
    user_id: str
    now: datetime
    # The conversation's key across files (:func:`conversation_key`), for the folds.
    key: str = ""
    memory_turns: dict[str, frozenset[str]] = field(default_factory=dict)
    distillation_turns: dict[str, frozenset[str]] = field(default_factory=dict)
    # Turns some active distillation holds (the ceiling of a recall of distillations alone).
    distilled_turns: frozenset[str] = frozenset()
    # The profile every block of this user carries (``services.profile``): each line's turns, and
    # the lines' tokens as the block shows them.
    profile_turns: list[frozenset[str]] = field(default_factory=list)
    profile_tokens: int = 0


@dataclass
class _PipelineTally:
    """What the pipeline did over a file's conversations: seconds per stage, counts, LLM calls."""

    seconds: dict[str, float] = field(default_factory=lambda: {
        "ingest": 0.0, "distill": 0.0, "conflicts": 0.0, "merge": 0.0, "exchange_vectors": 0.0})
    counts: dict[str, Any] = field(default_factory=lambda: {
        "turns": 0, "exchanges": 0, "memories": 0, "duplicate_turns": 0, "rejected_turns": 0, "distilled": 0,
        "distill_failed": 0, "conflicts": 0, "merges": 0})
    # The LLM's calls per stage: who answered, how fast, how often its answer was valid.
    llm_stages: dict[str, StageReport] = field(default_factory=lambda: {
        "distil": StageReport(), "conflicts": StageReport(), "merge": StageReport()})


def user_id_for(index: int, sample_id: str) -> str:
    """A valid Yak user id for conversation ``index`` (``sample_id`` made safe, made unique)."""
    safe = _USER_ID_UNSAFE.sub("-", sample_id).strip("-._@") or "conversation"
    return f"locomo{index}-{safe}"[:64]


def conversation_key(label: str, index: int) -> str:
    """The key of a file's ``index``-th conversation across all files (``<file>#<index>``)."""
    return f"{label}#{index}"


def _distil_provider(parts: YakParts, distiller: str) -> LLMProvider | None:
    """The provider that distils (and scores conflicts and merges), or None for ``none``."""
    if distiller == "none":
        return None
    if distiller == "rules":
        return RulesProvider()
    return parts.llm


def _store_exchanges(db: Database, conversation: Conversation, user_id: str, progress: Progress,
                     tally: _PipelineTally) -> tuple[int, int, dict[str, set[str]]]:
    """One conversation's exchanges stored as ``user_id``; returns how many exchanges and memories
    were stored and the turns each stored memory holds."""
    exchanges = conversation.exchanges()
    records = [ExchangeRecord(user_id=user_id, content=e.content, occurred_at=e.occurred_at, line=i + 1)
               for i, e in enumerate(exchanges)]
    # "Now" for ingestion is after the conversation, so no session counts as in the future.
    report = ingest_records(db, records, source="import", source_ref=f"locomo:{conversation.sample_id}",
                            now=conversation.last_session_at + timedelta(days=1))
    if report.rejected:
        tally.counts["rejected_turns"] += len(report.rejected)
        progress(f"{conversation.sample_id}: {len(report.rejected)} exchanges rejected, "
                 f"e.g. {report.rejected[0].reason}")
    with db.connection() as conn:
        rows = list_memories(conn, user_id=user_id, limit=len(records) + 1)
    by_hash = {r["content_sha256"]: str(r["id"]) for r in rows}
    memory_turns: dict[str, set[str]] = {}
    for exchange in exchanges:
        # Found by the text as it was stored: with its secrets replaced (core.secrets), as
        # ingestion hashes it; by the text as given, an exchange with a redaction held no turn.
        memory_id = by_hash.get(content_sha256(redact_secrets(normalise_exchange_text(exchange.content)).text))
        if memory_id is not None:
            memory_turns.setdefault(memory_id, set()).update(exchange.dia_ids)
    tally.counts["turns"] += len(conversation.turns)
    tally.counts["exchanges"] += len(records)
    tally.counts["memories"] += len(report.stored)
    tally.counts["duplicate_turns"] += len(report.duplicates)
    return len(records), len(report.stored), memory_turns


def _embedding_progress(progress: Progress, total: int, user_id: str) -> Callable[[int], None]:
    """The progress line of one user's exchange vectors, after each batch."""
    return lambda n: progress(f"  embedded {n}/{total} exchanges of {user_id}")


def _distil_and_consolidate(db: Database, settings: Settings, embedder: Embedder, llm: LLMProvider, user_id: str,
                            total_exchanges: int, progress: Progress, tally: _PipelineTally) -> None:
    """Distil one user's exchanges (in chunks, with progress), then score conflicts and merge near-duplicates."""
    job = DistillJob(db=db, llm=llm, embedder=embedder, prompt_version=settings.prompt_version,
                     alerter=NULL_ALERTER)
    consolidate = ConsolidateJob(db=db, llm=llm, embedder=embedder, alerter=NULL_ALERTER,
                                 concurrency=settings.llm_concurrency)
    counts, seconds = tally.counts, tally.seconds
    started = time.monotonic()
    pending = partition_memory_ids(db, user_id=user_id, day=None, include_outdated=False,
                                   prompt_version=settings.prompt_version)
    for offset in range(0, len(pending), _DISTIL_CHUNK):
        chunk = pending[offset:offset + _DISTIL_CHUNK]
        stage = distill_memories(job, chunk, concurrency=settings.llm_concurrency)
        tally.llm_stages["distil"].merge(stage)
        counts["distilled"] += stage.rows_out
        counts["distill_failed"] += stage.failed
        done = counts["distilled"] + counts["distill_failed"]
        rate = (offset + len(chunk)) / max(time.monotonic() - started, 1e-9)
        progress(f"  distilled {offset + len(chunk)}/{len(pending)} exchanges of {user_id} "
                 f"({done}/{total_exchanges} overall, {rate:.1f}/s, provider {llm.name})")
    seconds["distill"] += time.monotonic() - started

    started = time.monotonic()
    conflicts = score_conflicts(consolidate, user_id=user_id, day=None)
    seconds["conflicts"] += time.monotonic() - started
    started = time.monotonic()
    merges = merge_near_duplicates(consolidate, user_id=user_id, day=None)
    seconds["merge"] += time.monotonic() - started
    tally.llm_stages["conflicts"].merge(conflicts)
    tally.llm_stages["merge"].merge(merges)
    counts["conflicts"] += conflicts.flagged
    counts["merges"] += merges.flagged
    progress(f"  {conflicts.flagged} conflicts flagged, {merges.flagged} near-duplicates merged")


def _ingest(db: Database, settings: YakParts | Settings, embedder: Embedder, conversations: Sequence[Conversation],
            progress: Progress, *, distiller: str = "rules", label: str = "",
            ) -> tuple[list[IngestedConversation], dict[str, Any]]:
    """Every conversation through the pipeline's own functions (``settings``: Yak's parts, or the settings
    to build them from); returns the turn mapping and stage times."""
    parts = parts_of(settings)
    settings = parts.settings
    llm = _distil_provider(parts, distiller)
    tally = _PipelineTally()
    seconds = tally.seconds
    ingested: list[IngestedConversation] = []
    total_exchanges = sum(len(c.exchanges()) for c in conversations)
    for index, conversation in enumerate(conversations):
        user_id = user_id_for(index, conversation.sample_id)
        started = time.monotonic()
        exchanges, stored, memory_turns = _store_exchanges(db, conversation, user_id, progress, tally)
        seconds["ingest"] += time.monotonic() - started
        paired = " (user turn + assistant reply each)" if conversation.with_assistant else ""
        progress(f"[{index + 1}/{len(conversations)}] {label + ': ' if label else ''}{conversation.sample_id}: "
                 f"{len(conversation.turns)} turns → {exchanges} exchanges{paired}, {stored} stored "
                 f"as user {user_id}")

        if llm is not None:
            _distil_and_consolidate(db, settings, embedder, llm, user_id, total_exchanges, progress, tally)

        # With every distiller, "none" too: the exchange vectors and the context vectors (the
        # distillation stage embeds the contexts as it goes; embed_pending_exchanges does the rest).
        started = time.monotonic()
        embed_pending_exchanges(
            db, embedder, user_id=user_id, contexts=True,
            on_progress=_embedding_progress(progress, len(memory_turns), user_id))
        seconds["exchange_vectors"] += time.monotonic() - started
        ingested.append(IngestedConversation(
            source=conversation, user_id=user_id, now=conversation.last_session_at + timedelta(days=1),
            key=conversation_key(label, index),
            memory_turns={m: frozenset(t) for m, t in memory_turns.items()},
        ))
    with db.connection() as conn:
        statuses = status_counts(conn)
    tally.counts["distillations_by_status"] = {k: int(v) for k, v in sorted(statuses.items())}
    return ingested, {"seconds": {k: round(v, 2) for k, v in seconds.items()}, "counts": tally.counts,
                      "distiller": distiller, "llm_provider": llm.name if llm is not None else "none",
                      "llm": {name: llm_summary(stage) for name, stage in tally.llm_stages.items()}}


def llm_summary(stage: StageReport) -> dict[str, Any]:
    """One stage's LLM figures for the report: calls, requests, valid-output rate, latency, tokens, models."""
    latencies = sorted(stage.latencies_ms)
    rate = stage.valid_output_rate
    return {
        "calls": len(latencies), "failed_calls": stage.failed_calls, "requests": stage.llm_requests,
        "invalid_outputs": stage.invalid_outputs, "valid_output_rate": None if rate is None else round(rate, 4),
        "latency_ms": ({"p50": round(percentile(latencies, 50), 1), "p95": round(percentile(latencies, 95), 1),
                        "mean": round(sum(latencies) / len(latencies), 1)} if latencies else None),
        "prompt_tokens": stage.prompt_tokens if stage.tokens_reported else None,
        "completion_tokens": stage.completion_tokens if stage.tokens_reported else None,
        "models": dict(stage.models),
        "first_error": stage.errors[0][:300] if stage.errors else None,
    }
