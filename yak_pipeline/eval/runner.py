"""Run the LoCoMo retrieval evaluation: fresh databases, the real pipeline, the methods, metrics.

1. Each data file gets a new database ``yak_eval_<random>`` on the configured server (never the
   user's data), migrated for the configured embedder; they are dropped at the end, also on
   Ctrl-C or an error, unless asked to keep them.
2. Each conversation is one user. Its exchanges (``eval.locomo``: a user turn and the
   assistant's reply as one exchange where the second speaker is an assistant, else one exchange
   per turn) go through the real pipeline code: ``ingest_records`` (dated by the session), then,
   unless the distiller is ``none``, ``distill_memories`` with the chosen provider (``rules``: the
   offline rules provider; ``local``: the packaged local model; ``llm``: ``YAK_LLM_BASE_URL``),
   the confidence gate, ``score_conflicts`` and ``merge_near_duplicates``; finally every exchange
   gets its vector and its context vector (``embed_pending_exchanges``), as recall's exchange legs
   need — with every distiller, ``none`` included.
3. Every question is asked once, as of the day after the conversation's last session (``now`` =
   last session time + 1 day): the baselines' rankings and the production candidates
   (``store.recall.recall_candidates``, both kinds: active distillations and raw exchanges no
   active distillation holds) are collected once and kept. The candidates are labelled (a
   distillation holds the turns of its exchange and of any merged into it, a raw exchange its
   own turns) and become the relevance model's examples (``eval.calibrate``).
4. Relevance models are fitted on those examples, and every Yak figure is a pure re-ranking of the
   collected candidates with ``core.recall.rank_memories`` (what ``store.recall.recall`` does):

   - **Yak** — conversation-level K-fold cross-validation (:func:`assign_folds`): each
     conversation is ranked by a model fitted on the conversations of the other folds only
     (all files together; each file weighted equally, the classes equally). The figure decisions
     are made on, and the ``target`` line's;
   - **Yak (in-sample)** — one model fitted on every conversation given, ranked on the same ones
     (what ``yak eval calibrate`` writes);
   - **Yak (shipped model)** — the configured embedder's model as installed
     (``recall_models/<embedder>.json``, or ``$YAK_HOME``'s own fit).

Baselines, on the same databases and the same question embeddings:

- **BM25** — Okapi BM25 over the raw exchanges (PostgreSQL full text, ``store.recall.bm25_search``);
- **dense** — exact cosine similarity over the raw exchanges' vectors, same embedder.

Optional ablations re-run the default recall (``store.recall.recall`` on the live database, with
each conversation's cross-validated model) with one thing changed each (no gate, decay off,
other half-lives, relevance exponent, no supersession, no exchange context) on the same data.

Besides the ranking metrics (over categories 1-4), two measures of what a memory system must get
right beyond ranking:

- ``knowledge_update_current_first`` — over knowledge-update questions (category 2 with a known
  superseded statement): the share whose evidence turn is in the top 5 and above the superseded one;
- ``abstention_empty`` — over never-said questions (category 5 without evidence): the share whose
  recall, threshold applied, is empty. Dense always returns something (0); BM25 returns nothing
  when no word of the question is in any exchange, which counts as abstaining.

And for each Yak method, the *block* a prompt would get (``block``): the first
``YAK_PROXY_RECALL_LIMIT`` recalled memories cut as ``build_context`` cuts them
(``core.block_choice.choose_block``: the odds gap, superseded memories left out unless the question
asks about the past, the token budget), scored with ``eval.metrics.block_scores`` — precision,
recall, size, estimated tokens and stale lead, overall and per category — beside ``fixed_block``,
the same first memories with no cut (the block before the odds gap and the budget).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import numpy as np
import psycopg

from yak_pipeline.alerts import NULL_ALERTER
from yak_pipeline.core.block_choice import BlockChoice, BlockShape, block_shape, choose_block, line_tokens
from yak_pipeline.core.exchanges import content_sha256, normalise_exchange_text
from yak_pipeline.core.query_intent import asks_about_past, asks_about_present, query_parts
from yak_pipeline.core.recall import Candidate, RankedMemory, RecallParams, interleave, rank_memories
from yak_pipeline.core.relevance import (
    ANSWERABLE_FEATURES,
    FEATURES,
    RelevanceModel,
    answerable_features,
    relevance_features,
)
from yak_pipeline.core.secrets import redact_secrets
from yak_pipeline.embeddings import Embedder, get_embedder
from yak_pipeline.eval.calibrate import Examples, fit_model
from yak_pipeline.eval.locomo import CATEGORY_NAMES, KNOWLEDGE_UPDATE_CATEGORY, Conversation, Question
from yak_pipeline.eval.metrics import (
    PROFILE_ABILITIES,
    ScoredQuestion,
    abstained,
    aggregate,
    block_scores,
    current_first,
    profile_hit,
    score_ranking,
)
from yak_pipeline.ingestion.formats.exchange_records import ExchangeRecord
from yak_pipeline.ingestion.records import ingest_records
from yak_pipeline.llm import RulesProvider, get_llm_provider
from yak_pipeline.llm.provider import LLMProvider
from yak_pipeline.services.consolidate import ConsolidateJob, merge_near_duplicates, score_conflicts
from yak_pipeline.services.distill import DistillJob, distill_memories, partition_memory_ids
from yak_pipeline.services.profile import block_profile
from yak_pipeline.services.recall import (
    LLMRecallJudge,
    block_choice,
    embed_pending_exchanges,
    recall_hits,
    recall_params,
    relevance_model,
)
from yak_pipeline.services.reports import StageReport
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database, create_database, drop_database, resolve_database_url, with_database
from yak_pipeline.store.distillations import status_counts
from yak_pipeline.store.errors import StoreError
from yak_pipeline.store.memories import list_memories
from yak_pipeline.store.recall import (
    active_distillation_ids,
    bm25_search,
    recall,
    recall_candidates,
    source_memories,
    vector_search,
)

Progress = Callable[[str], None]
MethodKind = Literal["bm25", "dense", "yak", "yak_judged"]
# Which model ranks a Yak method: the conversation's fold model, the in-sample fit, the installed one.
ModelRole = Literal["cross_validated", "in_sample", "shipped"]
# What distils the exchanges: the offline rules provider, nothing, the packaged local model, or
# the configured endpoint (YAK_LLM_BASE_URL; the default when it is set).
Distiller = Literal["rules", "none", "local", "llm"]
DISTILLERS: tuple[str, ...] = ("rules", "none", "local", "llm")
# A data file's label and its conversations.
Dataset = tuple[str, Sequence[Conversation]]

BASELINES = ("BM25", "dense")
YAK = "Yak"
YAK_IN_SAMPLE = "Yak (in-sample)"
YAK_SHIPPED = "Yak (shipped model)"
YAK_NO_QUERY_PARTS = "Yak, no query parts"
YAK_JUDGED = "Yak + LLM judge"
DEFAULT_FOLDS = 5
_DISTIL_CHUNK = 100
_USER_ID_UNSAFE = re.compile(r"[^A-Za-z0-9._@-]+")


class EvalError(StoreError):
    """The evaluation cannot run (its database cannot be made, say); one line saying why."""


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
    # (services.recall.LLMRecallJudge, YAK_RECALL_LLM_JUDGE); needs YAK_LLM_BASE_URL.
    llm_judge: bool = False
    # What distils (DISTILLERS); None: "llm" when YAK_LLM_BASE_URL is set, else "rules". "local"
    # expects the settings to point at the packaged local model already (cli.eval starts it).
    distiller: str | None = None
    # Conversation-level folds of the cross-validation (at most one per conversation).
    folds: int = DEFAULT_FOLDS


@dataclass(frozen=True)
class Method:
    """One retrieval method under evaluation."""

    name: str
    kind: MethodKind
    params: RecallParams | None = None
    note: str = ""
    model: ModelRole = "cross_validated"
    # An ablation runs the live recall (its parameters can change the candidates), not a re-ranking.
    live: bool = False


@dataclass
class _Conversation:
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
class _Asked:
    """One question asked once: the baselines' rankings and Yak's candidates, labelled."""

    conversation: _Conversation
    question: Question
    vector: Sequence[float]
    candidates: list[Candidate]
    # The turns each candidate holds, by (kind, id).
    held: dict[tuple[str, str], frozenset[str]]
    candidates_ms: float
    baselines: dict[str, list[frozenset[str]]]
    baselines_ms: dict[str, float]
    # The best cosines of another person's memories for this question (answerability negatives).
    stranger_best: list[float] | None = None
    # The candidates of each thing the question lists (``core.query_intent.query_parts``), if any.
    part_candidates: list[list[Candidate]] = field(default_factory=list)


@dataclass
class CollectedFile:
    """A data file after the collection pass: its database (open), conversations and questions."""

    label: str
    conversations: Sequence[Conversation]
    ingested: list[_Conversation]
    asked: list[_Asked]
    pipeline: dict[str, Any]
    db: Database


def _quiet(_: str) -> None:
    """A progress sink that drops every line."""


def user_id_for(index: int, sample_id: str) -> str:
    """A valid Yak user id for conversation ``index`` (``sample_id`` made safe, made unique)."""
    safe = _USER_ID_UNSAFE.sub("-", sample_id).strip("-._@") or "conversation"
    return f"locomo{index}-{safe}"[:64]


def conversation_key(label: str, index: int) -> str:
    """The key of a file's ``index``-th conversation across all files (``<file>#<index>``)."""
    return f"{label}#{index}"


def resolve_distiller(settings: Settings, distiller: str | None) -> str:
    """The distiller to use: as asked, or ``llm`` when ``YAK_LLM_BASE_URL`` is set, else ``rules``."""
    if distiller is None:
        return "llm" if settings.llm_base_url else "rules"
    if distiller not in DISTILLERS:
        raise ValueError(f"unknown distiller {distiller!r}: use one of rules, none, local")
    if distiller in ("local", "llm") and not settings.llm_base_url:
        raise ValueError(f"the {distiller} distiller needs an LLM endpoint (YAK_LLM_BASE_URL or --distiller local)")
    return distiller


def build_methods(settings: Settings, options: EvalOptions) -> list[Method]:
    """BM25, dense, Yak three ways (cross-validated, in-sample, shipped), and with
    ``options.ablations`` variants of the cross-validated Yak."""
    depth = max(options.ks)
    base = recall_params(settings, threshold=options.threshold, limit=depth)
    methods = [
        Method("BM25", "bm25", note="Okapi BM25 over raw exchanges (PostgreSQL full text)"),
        Method("dense", "dense", note="exact cosine over raw exchanges, same embedder"),
        Method(YAK, "yak", base, model="cross_validated",
               note="the default recall, each conversation ranked by a relevance model fitted without it"),
        Method(YAK_IN_SAMPLE, "yak", base, model="in_sample",
               note="the default recall with a relevance model fitted on all these conversations"),
        Method(YAK_SHIPPED, "yak", base, model="shipped",
               note="the default recall with the installed relevance model (recall_models)"),
        Method(YAK_NO_QUERY_PARTS, "yak", replace(base, query_parts=False), model="cross_validated",
               note="the default recall, cross-validated, without recalling for each thing a question lists "
                    "(YAK_RECALL_QUERY_PARTS=false)"),
    ]
    if options.llm_judge:
        methods.append(Method(YAK_JUDGED, "yak_judged", base,
                              note="the cross-validated recall, then the LLM drops what it judges irrelevant"))
    if options.ablations:
        def variant(name: str, params: RecallParams) -> Method:
            return Method(name, "yak", params, live=True)

        methods += [
            variant("Yak, no gate", replace(base, gate=False)),
            variant("Yak, decay off", replace(base, decay_enabled=False)),
            *[variant(f"Yak, half-life {days:g} d", replace(base, decay_enabled=True, half_life_days=days))
              for days in (7.0, 90.0, 365.0) if not (settings.decay_enabled and days == settings.half_life_days)],
            *[variant(f"Yak, relevance exponent {e:g}", replace(base, relevance_exponent=e))
              for e in (3.0, 6.0, 12.0, 24.0) if e != base.relevance_exponent],
            variant("Yak, supersession ignored", replace(base, superseded_factor=1.0)),
            variant("Yak, exchange context off", replace(base, exchange_context=False)),
            variant("Yak, present questions by score", replace(base, present_newest_first=False)),
            variant("Yak, legs of 20", replace(base, leg_size=20)),
        ]
    return methods


@contextmanager
def evaluation_database(settings: Settings, *, keep: bool = False, progress: Progress = _quiet) -> Iterator[Database]:
    """A new, migrated database on the configured server for this evaluation alone; dropped after."""
    from yak_pipeline.wiring import open_database

    server_url = resolve_database_url(settings)
    name = f"yak_eval_{uuid.uuid4().hex[:12]}"
    try:
        create_database(server_url, name)
    except StoreError:
        raise  # already one line (server unreachable, say)
    except psycopg.Error as exc:  # a permission or server problem, said in one line
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise EvalError(f"cannot create the evaluation database: {reason} "
                        "(the database user needs CREATEDB)") from None
    db: Database | None = None
    try:
        db = open_database(settings, url=with_database(server_url, name), max_size=max(4, settings.llm_concurrency + 2))
        progress(f"evaluation database {name} created")
        yield db
    finally:
        if db is not None:
            db.close()
        if keep:
            progress(f"kept evaluation database {name}")
        else:
            drop_database(server_url, name)


def _distil_provider(settings: Settings, distiller: str) -> LLMProvider | None:
    """The provider that distils (and scores conflicts and merges), or None for ``none``."""
    if distiller == "none":
        return None
    if distiller == "rules":
        return RulesProvider()
    return get_llm_provider(settings)


def _ingest(db: Database, settings: Settings, embedder: Embedder, conversations: Sequence[Conversation],
            progress: Progress, *, distiller: str = "rules", label: str = "",
            ) -> tuple[list[_Conversation], dict[str, Any]]:
    """Every conversation through the pipeline's own functions; returns the turn mapping and stage times."""
    llm = _distil_provider(settings, distiller)
    seconds = {"ingest": 0.0, "distill": 0.0, "conflicts": 0.0, "merge": 0.0, "exchange_vectors": 0.0}
    counts = {"turns": 0, "exchanges": 0, "memories": 0, "duplicate_turns": 0, "rejected_turns": 0, "distilled": 0,
              "distill_failed": 0, "conflicts": 0, "merges": 0}
    # The LLM's calls per stage: who answered, how fast, how often its answer was valid.
    llm_stages = {"distil": StageReport(), "conflicts": StageReport(), "merge": StageReport()}
    ingested: list[_Conversation] = []
    total_exchanges = sum(len(c.exchanges()) for c in conversations)
    for index, conversation in enumerate(conversations):
        user_id = user_id_for(index, conversation.sample_id)
        started = time.monotonic()
        exchanges = conversation.exchanges()
        records = [ExchangeRecord(user_id=user_id, content=e.content, occurred_at=e.occurred_at, line=i + 1)
                   for i, e in enumerate(exchanges)]
        # "Now" for ingestion is after the conversation, so no session counts as in the future.
        report = ingest_records(db, records, source="import", source_ref=f"locomo:{conversation.sample_id}",
                                now=conversation.last_session_at + timedelta(days=1))
        if report.rejected:
            counts["rejected_turns"] += len(report.rejected)
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
        seconds["ingest"] += time.monotonic() - started
        counts["turns"] += len(conversation.turns)
        counts["exchanges"] += len(records)
        counts["memories"] += len(report.stored)
        counts["duplicate_turns"] += len(report.duplicates)
        paired = " (user turn + assistant reply each)" if conversation.with_assistant else ""
        progress(f"[{index + 1}/{len(conversations)}] {label + ': ' if label else ''}{conversation.sample_id}: "
                 f"{len(conversation.turns)} turns → {len(records)} exchanges{paired}, {len(report.stored)} stored "
                 f"as user {user_id}")

        if llm is not None:
            job = DistillJob(db=db, llm=llm, embedder=embedder, prompt_version=settings.prompt_version,
                             alerter=NULL_ALERTER)
            consolidate = ConsolidateJob(db=db, llm=llm, embedder=embedder, alerter=NULL_ALERTER,
                                         concurrency=settings.llm_concurrency)
            started = time.monotonic()
            pending = partition_memory_ids(db, user_id=user_id, day=None, include_outdated=False,
                                           prompt_version=settings.prompt_version)
            for offset in range(0, len(pending), _DISTIL_CHUNK):
                chunk = pending[offset:offset + _DISTIL_CHUNK]
                stage = distill_memories(job, chunk, concurrency=settings.llm_concurrency)
                llm_stages["distil"].merge(stage)
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
            llm_stages["conflicts"].merge(conflicts)
            llm_stages["merge"].merge(merges)
            counts["conflicts"] += conflicts.flagged
            counts["merges"] += merges.flagged
            progress(f"  {conflicts.flagged} conflicts flagged, {merges.flagged} near-duplicates merged")

        # With every distiller, "none" too: the exchange vectors and the context vectors (the
        # distillation stage embeds the contexts as it goes; embed_pending_exchanges does the rest).
        started = time.monotonic()
        embed_pending_exchanges(
            db, embedder, user_id=user_id, contexts=True,
            on_progress=lambda n, total=len(memory_turns), u=user_id: progress(f"  embedded {n}/{total} exchanges of {u}"))
        seconds["exchange_vectors"] += time.monotonic() - started
        ingested.append(_Conversation(
            source=conversation, user_id=user_id, now=conversation.last_session_at + timedelta(days=1),
            key=conversation_key(label, index),
            memory_turns={m: frozenset(t) for m, t in memory_turns.items()},
        ))
    with db.connection() as conn:
        statuses = status_counts(conn)
    counts["distillations_by_status"] = {k: int(v) for k, v in sorted(statuses.items())}
    return ingested, {"seconds": {k: round(v, 2) for k, v in seconds.items()}, "counts": counts,
                      "distiller": distiller, "llm_provider": llm.name if llm is not None else "none",
                      "llm": {name: llm_summary(stage) for name, stage in llm_stages.items()}}


def llm_summary(stage: StageReport) -> dict[str, Any]:
    """One stage's LLM figures for the report: calls, requests, valid-output rate, latency, tokens, models."""
    latencies = sorted(stage.latencies_ms)
    rate = stage.valid_output_rate
    return {
        "calls": len(latencies), "failed_calls": stage.failed_calls, "requests": stage.llm_requests,
        "invalid_outputs": stage.invalid_outputs, "valid_output_rate": None if rate is None else round(rate, 4),
        "latency_ms": ({"p50": round(_percentile(latencies, 50), 1), "p95": round(_percentile(latencies, 95), 1),
                        "mean": round(sum(latencies) / len(latencies), 1)} if latencies else None),
        "prompt_tokens": stage.prompt_tokens if stage.tokens_reported else None,
        "completion_tokens": stage.completion_tokens if stage.tokens_reported else None,
        "models": dict(stage.models),
        "first_error": stage.errors[0][:300] if stage.errors else None,
    }


def _distillation_turns(conn: Any, conversation: _Conversation, ids: Sequence[str]) -> list[frozenset[str]]:
    """The turns each distillation holds (its memory's and any merged memory's), cached."""
    missing = [i for i in ids if i not in conversation.distillation_turns]
    if missing:
        for distillation_id, memories in source_memories(conn, distillation_ids=missing).items():
            turns: set[str] = set()
            for memory_id in memories:
                turns |= conversation.memory_turns.get(memory_id, frozenset())
            conversation.distillation_turns[distillation_id] = frozenset(turns)
    return [conversation.distillation_turns.get(i, frozenset()) for i in ids]


def _candidate_turns(conn: Any, conversation: _Conversation,
                     candidates: Sequence[Candidate]) -> dict[tuple[str, str], frozenset[str]]:
    """The turns each candidate holds: a raw exchange its own, a distillation :func:`_distillation_turns`."""
    held: dict[tuple[str, str], frozenset[str]] = {}
    distilled = [c.id for c in candidates if c.kind != "raw"]
    for candidate_id, turns in zip(distilled, _distillation_turns(conn, conversation, distilled)):
        held[("distilled", candidate_id)] = turns
    for candidate in candidates:
        if candidate.kind == "raw":
            held[("raw", candidate.id)] = conversation.memory_turns.get(candidate.id, frozenset())
    return held


def _best_cosines(candidates: Sequence[Candidate]) -> list[float] | None:
    """The query-level features (ANSWERABLE_FEATURES order) of a candidate list; None when empty."""
    if not candidates:
        return None
    features = answerable_features(candidates[0].signals)  # the best_* are the same for all
    return [features[name] for name in ANSWERABLE_FEATURES]


def _ask(conn: Any, conversation: _Conversation, stranger: _Conversation | None, question: Question,
         vector: Sequence[float], embedder: Embedder, params: RecallParams) -> _Asked:
    """Ask one question once: BM25's and dense's rankings, Yak's candidates and another user's best cosines."""
    depth = params.limit
    baselines: dict[str, list[frozenset[str]]] = {}
    baselines_ms: dict[str, float] = {}
    began = time.perf_counter()
    hits = bm25_search(conn, table="memories", user_id=conversation.user_id, query=question.question, limit=depth)
    baselines_ms["BM25"] = (time.perf_counter() - began) * 1000
    baselines["BM25"] = [conversation.memory_turns.get(h.id, frozenset()) for h in hits]
    began = time.perf_counter()
    hits = vector_search(conn, table="memories", user_id=conversation.user_id, query_embedding=vector,
                         embedding_model=embedder.model_name, limit=depth, exact=True)
    baselines_ms["dense"] = (time.perf_counter() - began) * 1000
    baselines["dense"] = [conversation.memory_turns.get(h.id, frozenset()) for h in hits]
    began = time.perf_counter()
    candidates = recall_candidates(conn, user_id=conversation.user_id, query=question.question,
                                   query_embedding=vector, embedding_model=embedder.model_name, params=params)
    candidates_ms = (time.perf_counter() - began) * 1000
    part_candidates = [
        recall_candidates(conn, user_id=conversation.user_id, query=part, query_embedding=embedder.embed_query(part),
                          embedding_model=embedder.model_name, params=params, echo=question.question)
        for part in query_parts(question.question)]
    stranger_best = None
    if stranger is not None:
        stranger_best = _best_cosines(recall_candidates(
            conn, user_id=stranger.user_id, query=question.question, query_embedding=vector,
            embedding_model=embedder.model_name, params=params))
    every = [*candidates, *(c for part in part_candidates for c in part)]
    return _Asked(conversation=conversation, question=question, vector=vector, candidates=candidates,
                  held=_candidate_turns(conn, conversation, every), candidates_ms=candidates_ms,
                  baselines=baselines, baselines_ms=baselines_ms, stranger_best=stranger_best,
                  part_candidates=part_candidates)


def collect(settings: Settings, datasets: Sequence[Dataset], options: EvalOptions, *, stack: ExitStack,
            progress: Progress = _quiet) -> list[CollectedFile]:
    """The collection pass: each file into its own database (kept open in ``stack``), every question asked once."""
    embedder = get_embedder(settings)
    distiller = resolve_distiller(settings, options.distiller)
    params = recall_params(settings, threshold=options.threshold, limit=max(options.ks))
    files: list[CollectedFile] = []
    for label, conversations in datasets:
        db = stack.enter_context(evaluation_database(settings, keep=options.keep_database, progress=progress))
        ingested, pipeline = _ingest(db, settings, embedder, conversations, progress, distiller=distiller,
                                     label=label)
        asked: list[_Asked] = []
        total = sum(len(c.questions) + len(c.never_said) for c in conversations)
        started = time.monotonic()
        for index, conversation in enumerate(ingested):
            # Another person's memories cannot answer this person's questions: asked of them, every
            # question is a never-said one (for the answerability factor only).
            stranger = ingested[(index + 1) % len(ingested)] if len(ingested) > 1 else None
            questions = list(conversation.source.questions) + list(conversation.source.never_said)
            profile = block_profile(db, conversation.user_id, token_budget=settings.profile_tokens)
            conversation.profile_turns = [conversation.memory_turns.get(line.memory_id, frozenset()) for line in profile]
            conversation.profile_tokens = sum(line_tokens(line.text) for line in profile)
            with db.connection() as conn:
                ids = active_distillation_ids(conn, user_id=conversation.user_id, embedding_model=embedder.model_name)
                held = _distillation_turns(conn, conversation, ids)
                conversation.distilled_turns = frozenset().union(*held) if held else frozenset()
                for question in questions:
                    vector = embedder.embed_query(question.question)
                    asked.append(_ask(conn, conversation, stranger, question, vector, embedder, params))
                    if len(asked) % 50 == 0 or len(asked) == total:
                        rate = len(asked) / max(time.monotonic() - started, 1e-9)
                        progress(f"{label}: asked {len(asked)}/{total} questions ({rate:.1f} questions/s)")
        files.append(CollectedFile(label=label, conversations=conversations, ingested=ingested, asked=asked,
                                   pipeline=pipeline, db=db))
    return files


def examples_from(files: Sequence[CollectedFile]) -> Examples:
    """The labelled examples of the collected questions (``eval.calibrate``'s module docstring).

    Each candidate of each question is a row (``FEATURES`` order), relevant when it holds one of
    the question's evidence turns; never-said questions give only negatives. Query-level rows
    (the answerability factor): each answerable question whose evidence some candidate holds (1),
    each never-said question (0), and each question asked of another person's memories (0). Every
    row names its conversation (and a stranger row also the other person's), for the folds.
    """
    rows: list[list[float]] = []
    labels: list[int] = []
    files_of: list[str] = []
    conversations: list[str] = []
    q_rows: list[list[float]] = []
    q_labels: list[int] = []
    q_files: list[str] = []
    q_conversations: list[str] = []
    q_others: list[str] = []
    for collected in files:
        keys = [c.key for c in collected.ingested]
        for asked in collected.asked:
            key = asked.conversation.key
            relevant = [1 if asked.held.get((c.kind, c.id), frozenset()) & asked.question.evidence else 0
                        for c in asked.candidates]
            for candidate, is_relevant in zip(asked.candidates, relevant):
                features = relevance_features(candidate.signals)
                rows.append([features[name] for name in FEATURES])
                labels.append(is_relevant)
                files_of.append(collected.label)
                conversations.append(key)
            best = _best_cosines(asked.candidates)
            # An answerable question whose evidence no leg found teaches nothing here.
            if best is not None and (any(relevant) or not asked.question.evidence):
                q_rows.append(best)
                q_labels.append(1 if any(relevant) else 0)
                q_files.append(collected.label)
                q_conversations.append(key)
                q_others.append(key)
            if asked.stranger_best is not None:
                q_rows.append(asked.stranger_best)
                q_labels.append(0)
                q_files.append(collected.label)
                q_conversations.append(key)
                q_others.append(keys[(keys.index(key) + 1) % len(keys)])
    return Examples(
        np.asarray(rows, dtype=np.float64).reshape(-1, len(FEATURES)), np.asarray(labels, dtype=np.float64),
        np.asarray(files_of, dtype=object), np.asarray(conversations, dtype=object),
        np.asarray(q_rows, dtype=np.float64).reshape(-1, len(ANSWERABLE_FEATURES)),
        np.asarray(q_labels, dtype=np.float64), np.asarray(q_files, dtype=object),
        np.asarray(q_conversations, dtype=object), np.asarray(q_others, dtype=object))


# --- cross-validation ------------------------------------------------------------------------------


def assign_folds(files: Sequence[tuple[str, int]], folds: int) -> dict[str, int]:
    """Each conversation's fold, by key (:func:`conversation_key`), from ``(file label, conversations)`` pairs.

    Round-robin within each file, continuing where the previous file stopped: file by file in the
    order given, conversation by conversation in file order, fold ``(offset + i) % folds``. Every
    file is spread over the folds (a file of at least two conversations is in every fold's
    training set), the folds differ in size by at most one, and the assignment depends only on
    the order of the files and of their conversations.
    """
    if folds < 2:
        raise ValueError(f"cross-validation needs at least 2 folds, got {folds}")
    assignment: dict[str, int] = {}
    offset = 0
    for label, count in files:
        for index in range(count):
            assignment[conversation_key(label, index)] = (offset + index) % folds
        offset += count
    return assignment


@dataclass
class CrossValidation:
    """The folds and each fold's model (fitted without the fold's conversations)."""

    folds: int
    assignment: dict[str, int]
    models: dict[int, RelevanceModel]
    # Folds whose model could not be fitted, with why (their conversations use the fallback).
    failed: dict[int, str]
    fallback: RelevanceModel
    # Per fold: the conversations it holds and how many examples its model was fitted on.
    trained: dict[int, dict[str, Any]] = field(default_factory=dict)

    def model_for(self, key: str) -> RelevanceModel:
        """The model that ranks conversation ``key``: its fold's, or the fallback if that one failed."""
        return self.models.get(self.assignment[key], self.fallback)


def cross_validate(examples: Examples, files: Sequence[tuple[str, int]], folds: int, *, embedding_model: str,
                   fallback: RelevanceModel, progress: Progress = _quiet) -> CrossValidation | None:
    """Fit one model per fold on the examples of the other folds' conversations; None below 2 conversations."""
    total = sum(count for _, count in files)
    if total < 2:
        return None
    k = min(folds, total)
    assignment = assign_folds(files, k)
    models: dict[int, RelevanceModel] = {}
    failed: dict[int, str] = {}
    trained: dict[int, dict[str, Any]] = {}
    for fold in range(k):
        held_out = frozenset(key for key, f in assignment.items() if f == fold)
        trained[fold] = {"held_out": sorted(held_out),
                         "examples": int((~np.isin(examples.conversations, list(held_out))).sum())}
        try:
            models[fold] = fit_model(examples, embedding_model=embedding_model, exclude=held_out,
                                     version=f"{embedding_model}@fold-{fold + 1}-of-{k}")
        except ValueError as exc:
            failed[fold] = str(exc)
            progress(f"fold {fold + 1}/{k}: cannot fit ({exc}); its conversations use {fallback.version}")
        else:
            progress(f"fold {fold + 1}/{k}: fitted on {trained[fold]['examples']} examples "
                     f"(without {len(held_out)} conversations)")
    return CrossValidation(folds=k, assignment=assignment, models=models, failed=failed, fallback=fallback,
                           trained=trained)


def _rank(asked: _Asked, model: RelevanceModel, params: RecallParams) -> list[RankedMemory]:
    """Yak's ranking of the collected candidates with ``model`` (what ``services.recall.search_memories``
    does: ``store.recall.recall`` of the question, and of each thing it lists, interleaved)."""
    about_present = asks_about_present(asked.question.question)
    rankings = [rank_memories(candidates, model=model, params=params, now=asked.conversation.now,
                              about_present=about_present)
                for candidates in [asked.candidates, *(asked.part_candidates if params.query_parts else [])]]
    return rankings[0] if len(rankings) == 1 else interleave(rankings, params.limit)


def _hit_texts(conn: Any, ranked: Sequence[RankedMemory]) -> list[str]:
    """What each ranked memory says, as the block shows it (``services.recall.recall_hits``: a
    distillation's text, a raw exchange's user side); "" for one that is gone."""
    shown = {(h.ranked.kind, h.ranked.id): h.content for h in recall_hits(conn, ranked)}
    return [shown.get((r.kind, r.id), "") for r in ranked]


@dataclass(frozen=True)
class BlockSpec:
    """How a prompt's block is made from what recall ranks: the first ``limit`` memories, cut by ``choice``."""

    limit: int
    choice: BlockChoice
    exponent: float


def _block(asked: _Asked, ranked: Sequence[RankedMemory], items: Sequence[frozenset[str]], texts: Sequence[str],
           spec: BlockSpec, *, cut: bool) -> tuple[list[frozenset[str]], int]:
    """The block's memories (each the turns it holds) and its estimated tokens; with ``cut`` False,
    the first memories as they come (the block before the odds gap and the budget). The tokens are
    each kept memory's whole line: a bound, since the block cuts a first line longer than the budget."""
    # A question that gathers gets up to the gather limit, no odds gap, newest first (the shape
    # services.recall.build_context cuts too; here by when each memory was last stated).
    shape = block_shape(asked.question.question, spec.limit, spec.choice) if cut else BlockShape(spec.limit, spec.choice)
    top = list(range(min(shape.limit, len(ranked))))
    tokens = [line_tokens(texts[i]) for i in top]
    if cut:
        history = asks_about_past(asked.question.question)
        chosen = choose_block([ranked[i].rank_odds for i in top], tokens, exponent=spec.exponent, choice=shape.choice,
                              superseded=None if history else [ranked[i].superseded_by is not None for i in top])
        top = [top[i] for i in chosen]
        if shape.newest_first:
            top = sorted(top, key=lambda i: ranked[i].refreshed_at, reverse=True)
    return [items[i] for i in top], sum(tokens[i] for i in top)


@dataclass
class _Models:
    """The relevance models of a run."""

    shipped: RelevanceModel
    in_sample: RelevanceModel | None
    cross_validation: CrossValidation | None

    def for_role(self, role: ModelRole, key: str) -> RelevanceModel | None:
        if role == "shipped":
            return self.shipped
        if role == "in_sample":
            return self.in_sample
        if self.cross_validation is not None:
            return self.cross_validation.model_for(key)
        return self.in_sample or self.shipped


def _items(method: Method, asked: _Asked, collected: CollectedFile, models: _Models, embedder: Embedder,
           judge: LLMRecallJudge | None) -> tuple[list[frozenset[str]], float, list[RankedMemory] | None] | None:
    """One method's ranked items for one asked question (each the turns it holds), its time in ms
    and (a Yak method) the ranked memories; None when the method has no model (an in-sample fit
    that failed)."""
    if method.kind in ("bm25", "dense"):
        return asked.baselines[method.name], asked.baselines_ms[method.name], None
    model = models.for_role(method.model, asked.conversation.key)
    if model is None:
        return None
    assert method.params is not None
    conversation = asked.conversation
    if method.live:
        with collected.db.connection() as conn:
            began = time.perf_counter()
            ranked = recall(conn, user_id=conversation.user_id, query=asked.question.question,
                            query_embedding=asked.vector, embedding_model=embedder.model_name,
                            params=method.params, model=model, now=conversation.now)
            ms = (time.perf_counter() - began) * 1000
            held = {**asked.held, **_candidate_turns(conn, conversation, [r for r in ranked
                                                                          if (r.kind, r.id) not in asked.held])}
        return [held.get((r.kind, r.id), frozenset()) for r in ranked], ms, ranked
    began = time.perf_counter()
    ranked = _rank(asked, model, method.params)
    ms = asked.candidates_ms + (time.perf_counter() - began) * 1000
    if method.kind == "yak_judged" and judge is not None and ranked:
        with collected.db.connection() as conn:
            kept = judge.kept(asked.question.question, _hit_texts(conn, ranked))
        if kept is not None:
            ranked = [ranked[i] for i, _ in kept]
    return [asked.held.get((r.kind, r.id), frozenset()) for r in ranked], ms, ranked


# One answerable question's block: its category, its ability (or None), the block's scores, its tokens.
_BlockRow = tuple[int, str | None, dict[str, float | None], int]


def _block_report(rows: Sequence[_BlockRow]) -> dict[str, Any]:
    """The block measures (``eval.metrics.block_scores`` and tokens) averaged overall, per category
    and (where the file names them) per ability."""
    groups: dict[str, list[tuple[dict[str, float | None], int]]] = {}
    abilities: dict[str, list[tuple[dict[str, float | None], int]]] = {}
    for category, ability, score, tokens in rows:
        groups.setdefault(str(category), []).append((score, tokens))
        if ability is not None:
            abilities.setdefault(ability, []).append((score, tokens))

    def summary(rows: list[tuple[dict[str, float | None], int]]) -> dict[str, Any]:
        def mean(key: str) -> float | None:
            return _mean_or_none([s[key] for s, _ in rows if s[key] is not None])  # type: ignore[misc]
        return {"n": len(rows), "block_precision": mean("precision"), "block_recall": mean("recall"),
                "block_size": mean("size"), "stale_lead": mean("stale_lead"),
                "stale_lead_n": sum(1 for s, _ in rows if s["stale_lead"] is not None),
                "empty": _mean_or_none([float(s["size"] == 0) for s, _ in rows]),
                "tokens": _mean_or_none([float(t) for _, t in rows]),
                # The profile part (issue 39): sent with every block, apart from the recalled memories.
                "profile_hit": mean("profile_hit"),
                "profile_hit_n": sum(1 for s, _ in rows if s["profile_hit"] is not None),
                "profile_tokens": mean("profile_tokens"),
                "tokens_with_profile": _mean_or_none([float(t) + (s["profile_tokens"] or 0.0) for s, t in rows])}

    overall = summary([(score, tokens) for _, _, score, tokens in rows])
    return {**overall, "by_category": {key: summary(groups[key]) for key in sorted(groups, key=int)},
            "by_ability": {key: summary(abilities[key]) for key in sorted(abilities)}}


def _file_report(collected: CollectedFile, methods: Sequence[Method], models: _Models, embedder: Embedder,
                 judge: LLMRecallJudge | None, ks: tuple[int, ...], required_points: float,
                 block: BlockSpec) -> dict[str, Any]:
    """One file's figures: every method overall and per category, the extra measures, the block
    (Yak methods but the ablations), the target."""
    results: dict[str, list[ScoredQuestion]] = {m.name: [] for m in methods}
    # The ranking metrics per ability, where the file names abilities (BEAM's).
    by_ability: dict[str, dict[str, list[ScoredQuestion]]] = {m.name: {} for m in methods}
    # Per method, one row per answerable question: the cut block and the fixed one.
    blocks: dict[str, dict[str, list[_BlockRow]]] = {m.name: {"block": [], "fixed_block": []} for m in methods}
    current_first_scores: dict[str, list[float]] = {m.name: [] for m in methods}
    abstained_scores: dict[str, list[float]] = {m.name: [] for m in methods}
    latency_ms: dict[str, list[float]] = {m.name: [] for m in methods}
    missing: set[str] = set()
    for asked in collected.asked:
        question = asked.question
        for method in methods:
            got = _items(method, asked, collected, models, embedder, judge)
            if got is None:
                missing.add(method.name)
                continue
            items, ms, ranked = got
            if ranked is not None and not method.live and question.evidence:
                with collected.db.connection() as conn:
                    texts = _hit_texts(conn, ranked[:max(block.limit, block.choice.gather_limit)])
                profile = asked.conversation.profile_turns
                for name, cut in (("block", True), ("fixed_block", False)):
                    chosen, tokens = _block(asked, ranked, items, texts, block, cut=cut)
                    scores = block_scores(chosen, question.evidence, question.superseded)
                    scores["profile_hit"] = (profile_hit(chosen, profile, question.evidence)
                                             if question.ability in PROFILE_ABILITIES else None)
                    scores["profile_tokens"] = float(asked.conversation.profile_tokens)
                    blocks[method.name][name].append((question.category, question.ability, scores, tokens))
            if not question.evidence:
                abstained_scores[method.name].append(abstained(items))
                continue
            latency_ms[method.name].append(ms)
            scored = ScoredQuestion(question.category, score_ranking(items, question.evidence, ks))
            results[method.name].append(scored)
            if question.ability is not None:
                by_ability[method.name].setdefault(question.ability, []).append(scored)
            if question.category == KNOWLEDGE_UPDATE_CATEGORY and question.superseded:
                current_first_scores[method.name].append(current_first(items, question.evidence,
                                                                       question.superseded, k=5))
    method_reports: dict[str, dict] = {}
    for method in methods:
        if method.name in missing:
            continue
        summary = aggregate(results[method.name], ks)
        samples = sorted(latency_ms[method.name])
        method_reports[method.name] = {
            "kind": method.kind,
            "model": method.model if method.kind != "bm25" and method.kind != "dense" else None,
            "note": method.note,
            "overall": summary.pop("overall"),
            "by_category": summary,
            "by_ability": {ability: aggregate(scored, ks)["overall"]
                           for ability, scored in sorted(by_ability[method.name].items())},
            "latency_ms": {"p50": round(_percentile(samples, 50), 2), "p95": round(_percentile(samples, 95), 2)},
            "knowledge_update_current_first": _mean_or_none(current_first_scores[method.name]),
            "knowledge_update_n": len(current_first_scores[method.name]),
            "abstention_empty": _mean_or_none(abstained_scores[method.name]),
            "abstention_n": len(abstained_scores[method.name]),
        }
        if blocks[method.name]["block"]:
            method_reports[method.name]["block"] = _block_report(blocks[method.name]["block"])
            method_reports[method.name]["fixed_block"] = _block_report(blocks[method.name]["fixed_block"])
    main = [m.name for m in methods if not m.live and m.name in method_reports]
    conversations = collected.conversations
    skipped: dict[str, int] = {}
    for conversation in conversations:
        for key, value in conversation.skipped.items():
            skipped[key] = skipped.get(key, 0) + value
    coverage = [len(a.question.evidence & a.conversation.distilled_turns) / len(a.question.evidence)
                for a in collected.asked if a.question.evidence]
    return {
        "data": collected.label,
        "conversations": len(conversations),
        "turns": sum(len(c.turns) for c in conversations),
        "exchanges": sum(len(c.exchanges()) for c in conversations),
        # Where the second speaker is an assistant, a user turn and its reply are one exchange.
        "paired_conversations": sum(1 for c in conversations if c.with_assistant),
        "questions": {"scored": sum(len(c.questions) for c in conversations),
                      "never_said": sum(len(c.never_said) for c in conversations), "skipped": skipped},
        "methods": {name: method_reports[name] for name in main},
        "ablations": {name: method_reports[name] for name in method_reports if name not in main},
        "target": _target(method_reports, YAK, max(ks), required_points),
        # The mean share of a question's evidence turns held by an active distillation: no recall
        # of distillations alone could score a higher Recall@k; raw exchanges hold the rest.
        "distilled_evidence": round(sum(coverage) / len(coverage), 4) if coverage else 0.0,
        "pipeline": collected.pipeline,
    }


def _evaluation_note(cv: CrossValidation | None, files: Sequence[CollectedFile]) -> str:
    """How the "Yak" figure was obtained, in words (the JSON's ``evaluation``)."""
    total = sum(len(f.ingested) for f in files)
    if cv is None:
        return (f"no cross-validation: {total} conversation(s), at least 2 are needed; "
                f"\"{YAK}\" uses the in-sample model (or the shipped one if it could not be fitted)")
    scope = (f"the {total} conversations of all {len(files)} files together" if len(files) > 1
             else f"the {total} conversations of the one file given (within that file)")
    note = (f"conversation-level {cv.folds}-fold cross-validation over {scope}: folds assigned round-robin "
            f"within each file; each conversation ranked by a model fitted without its fold")
    if cv.failed:
        note += (f"; folds {', '.join(str(f + 1) for f in sorted(cv.failed))} could not be fitted and rank "
                 f"with {cv.fallback.version}")
    return note


def run_evaluation(settings: Settings, datasets: Sequence[Dataset], options: EvalOptions = EvalOptions(),
                   *, progress: Progress = _quiet, command: str = "") -> tuple[dict[str, Any], RelevanceModel | None]:
    """The collection pass, the fits (cross-validated and in-sample) and every method's figures.

    Returns the report (``eval.report``) and the in-sample model (fitted on everything; None when
    it cannot be fitted), which ``yak eval calibrate`` writes.
    """
    if not options.ks or any(k < 1 for k in options.ks):
        raise ValueError(f"ks must be positive integers, got {list(options.ks)}")
    if not datasets:
        raise ValueError("no data files")
    labels = [label for label, _ in datasets]
    if len(set(labels)) != len(labels):
        raise ValueError("the same data file is given twice")
    ks = tuple(sorted(set(options.ks)))
    options = replace(options, ks=ks)
    embedder = get_embedder(settings)
    distiller = resolve_distiller(settings, options.distiller)
    methods = build_methods(settings, options)
    shipped = options.model or relevance_model(settings, embedder)
    judge = None
    if options.llm_judge:
        if not settings.llm_base_url:
            raise ValueError("--llm-judge needs an LLM endpoint: set YAK_LLM_BASE_URL (or use --distiller local)")
        judge = LLMRecallJudge.from_settings(settings, get_llm_provider(settings))
    started = time.monotonic()
    with ExitStack() as stack:
        files = collect(settings, datasets, options, stack=stack, progress=progress)
        collected_at = time.monotonic()
        examples = examples_from(files)
        counts = [(f.label, len(f.ingested)) for f in files]
        in_sample: RelevanceModel | None
        in_sample_note = ""
        try:
            in_sample = fit_model(examples, embedding_model=embedder.model_name, extra={
                "distiller": distiller, "leg_size": settings.recall_leg_size,
                "exchange_context": settings.recall_exchange_context,
                "command": command or ("yak eval calibrate " + " ".join(f"--data {label}" for label in labels)
                                       + f" --distiller {distiller}")})
        except ValueError as exc:
            in_sample, in_sample_note = None, f"the in-sample model could not be fitted: {exc}"
            progress(in_sample_note)
        cv = cross_validate(examples, counts, options.folds, embedding_model=embedder.model_name,
                            fallback=in_sample or shipped, progress=progress) if options.folds >= 2 else None
        models = _Models(shipped=shipped, in_sample=in_sample, cross_validation=cv)
        file_reports = {}
        block = BlockSpec(limit=settings.proxy_recall_limit, choice=block_choice(settings),
                          exponent=settings.recall_relevance_exponent)
        for collected in files:
            progress(f"{collected.label}: scoring {len(methods)} methods")
            file_reports[collected.label] = _file_report(collected, methods, models, embedder, judge, ks,
                                                         options.required_points, block)
        fitted_at = time.monotonic()
    targets = {label: report["target"] for label, report in file_reports.items()}
    cross_validation: dict[str, Any] = {"folds": cv.folds if cv else 0, "note": _evaluation_note(cv, files)}
    if cv is not None:
        by_file: dict[str, dict[str, int]] = {}
        for collected in files:
            by_file[collected.label] = {c.source.sample_id: cv.assignment[c.key] + 1 for c in collected.ingested}
        cross_validation.update({
            "within_one_file": len(files) == 1,
            "assignment": by_file,
            "fold_models": {str(fold + 1): {"version": cv.models[fold].version if fold in cv.models else None,
                                            "held_out_conversations": len(cv.trained[fold]["held_out"]),
                                            "training_examples": cv.trained[fold]["examples"],
                                            "failed": cv.failed.get(fold)}
                            for fold in range(cv.folds)},
        })
    first = file_reports[labels[0]]
    return {
        "data": labels,
        "distiller": distiller,
        "evaluation": _evaluation_note(cv, files),
        "cross_validation": cross_validation,
        "conversations": sum(r["conversations"] for r in file_reports.values()),
        "turns": sum(r["turns"] for r in file_reports.values()),
        "questions": {"scored": sum(r["questions"]["scored"] for r in file_reports.values()),
                      "never_said": sum(r["questions"]["never_said"] for r in file_reports.values())},
        "categories": {str(k): v for k, v in CATEGORY_NAMES.items() if k != 5},
        "ks": list(ks),
        "settings": {
            "embedder": embedder.model_name, "distiller": distiller, "llm_provider": first["pipeline"]["llm_provider"],
            "threshold": options.threshold, "half_life_days": settings.half_life_days,
            "decay_enabled": settings.decay_enabled, "core_threshold_multiplier": settings.core_threshold_multiplier,
            "relevance_model": shipped.version,
            "relevance_models": {"shipped": shipped.version, "in_sample": in_sample.version if in_sample else None,
                                 "cross_validated": [m.version for m in cv.models.values()] if cv else []},
            "relevance_exponent": settings.recall_relevance_exponent,
            "superseded_factor": settings.recall_superseded_factor, "leg_size": settings.recall_leg_size,
            "exchange_context": settings.recall_exchange_context,
            "block": {"limit": block.limit, "odds_gap": block.choice.odds_gap,
                      "token_budget": block.choice.token_budget, "profile_tokens": block.choice.profile_tokens,
                      "gather_limit": block.choice.gather_limit},
        },
        "notes": [n for n in (in_sample_note,) if n],
        # The model fitted on everything (what `yak eval calibrate` writes), to inspect or ship.
        "in_sample_model": in_sample.to_dict() if in_sample is not None else None,
        "default_method": YAK,
        "files": file_reports,
        # Met when the cross-validated Yak clears the bar on every file.
        "target": {"metric": f"recall@{max(ks)}", "default_method": YAK,
                   "met": all(t["met"] for t in targets.values()), "files": targets},
        "seconds": round(time.monotonic() - started, 1),
        "stage_seconds": {"ingest_and_ask": round(collected_at - started, 1),
                          "fit_and_score": round(fitted_at - collected_at, 1)},
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }, in_sample


def run_locomo_eval(settings: Settings, data: Sequence[Dataset] | Sequence[Conversation],
                    options: EvalOptions = EvalOptions(), *, progress: Progress = _quiet,
                    data_label: str = "") -> dict[str, Any]:
    """Run the whole evaluation and return the report (see ``yak_pipeline.eval.report`` for its output).

    ``data`` is a list of ``(file label, conversations)``, or one file's conversations (labelled
    ``data_label``).
    """
    datasets: list[Dataset]
    if data and isinstance(data[0], Conversation):
        datasets = [(data_label or "data", list(data))]  # type: ignore[arg-type]
    else:
        datasets = list(data)  # type: ignore[arg-type]
    report, _ = run_evaluation(settings, datasets, options, progress=progress)
    return report


def _target(methods: dict[str, dict], default_method: str, depth: int, required_points: float) -> dict[str, Any]:
    """The bar: the default recall's Recall@k ≥ the better baseline's + ``required_points``."""
    key = f"recall@{depth}"
    default = methods[default_method]["overall"][key]
    best_name = max(BASELINES, key=lambda name: methods[name]["overall"][key])
    best = methods[best_name]["overall"][key]
    margin = (default - best) * 100
    return {"metric": key, "default_method": default_method, "default": round(default, 4),
            "best_baseline": best_name, "baseline": round(best, 4), "margin_points": round(margin, 2),
            "required_points": required_points, "met": margin >= required_points}


def _mean_or_none(values: Sequence[float]) -> float | None:
    """The mean, rounded, or None when there is nothing to average (the measure does not apply)."""
    return round(sum(values) / len(values), 4) if values else None


def _percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted values (0 for none)."""
    if not sorted_values:
        return 0.0
    rank = max(1, min(len(sorted_values), round(pct / 100 * len(sorted_values) + 0.5)))
    return float(sorted_values[rank - 1])
