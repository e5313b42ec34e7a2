"""Run the LoCoMo retrieval evaluation: a fresh database, the real pipeline, four methods, metrics.

1. A new database ``yak_eval_<random>`` is created on the configured server (never the user's
   data) and migrated for the configured embedder; it is dropped at the end, also on Ctrl-C or
   an error, unless asked to keep it.
2. Each conversation is one user. Its turns go through the real pipeline code: ``ingest_records``
   (one exchange per turn, dated by its session), ``distill_memories`` with the configured LLM
   provider (the offline rules provider when none is set) and embedder, the confidence gate, then
   ``score_conflicts`` and ``merge_near_duplicates``; finally every exchange gets its vector
   (``embed_pending_exchanges``), as recall's exchange-vector leg needs.
3. Every scored question is asked of each method as of the day after the conversation's last
   session (``now`` = last session time + 1 day), and the ranking is scored against its evidence.

Methods, all on the same database and the same question embeddings:

- **BM25** — Okapi BM25 over the raw exchanges (PostgreSQL full text, ``store.recall.bm25_search``);
- **dense** — exact cosine similarity over the raw exchanges' vectors, same embedder;
- **Yak** — the default recall (``store.recall.recall``, the one engine the API and CLI use):
  calibrated relevance, the tier gate at the request threshold, decay, warmth, gravity.

Optional ablations re-run Yak with one thing changed each (no gate, decay off, other
half-lives, relevance exponent, no supersession, no exchange context) on the same data.

Besides the ranking metrics (over categories 1-4), two measures of what a memory system must get
right beyond ranking:

- ``knowledge_update_current_first`` — over knowledge-update questions (category 2 with a known
  superseded statement): the share whose evidence turn is in the top 5 and above the superseded one;
- ``abstention_empty`` — over never-said questions (category 5 without evidence): the share whose
  recall, threshold applied, is empty. The baselines always return something, so theirs is 0.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator, Literal

import psycopg

from yak_pipeline.alerts import NULL_ALERTER
from yak_pipeline.core.exchange_files import ExchangeRecord
from yak_pipeline.core.exchanges import content_sha256
from yak_pipeline.embeddings import Embedder, get_embedder
from yak_pipeline.eval.locomo import CATEGORY_NAMES, KNOWLEDGE_UPDATE_CATEGORY, Conversation, Question
from yak_pipeline.eval.metrics import ScoredQuestion, abstained, aggregate, current_first, score_ranking
from yak_pipeline.llm import get_llm_provider
from yak_pipeline.services.consolidate import ConsolidateJob, merge_near_duplicates, score_conflicts
from yak_pipeline.services.distill import DistillJob, distill_memories, partition_memory_ids
from yak_pipeline.ingestion.records import ingest_records
from yak_pipeline.core.recall import RecallParams
from yak_pipeline.core.relevance import RelevanceModel
from yak_pipeline.services.recall import LLMRecallJudge, embed_pending_exchanges, recall_params, relevance_model
from yak_pipeline.services.reports import StageReport
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database, create_database, drop_database, resolve_database_url, with_database
from yak_pipeline.store.distillations import recall_hit_rows, status_counts
from yak_pipeline.store.errors import StoreError
from yak_pipeline.store.memories import list_memories
from yak_pipeline.store.recall import active_distillation_ids, bm25_search, recall, source_memories, vector_search

Progress = Callable[[str], None]
MethodKind = Literal["bm25", "dense", "yak", "yak_judged"]

BASELINES = ("BM25", "dense")
YAK = "Yak"
YAK_JUDGED = "Yak + LLM judge"
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
    # A relevance model to evaluate instead of the configured embedder's (calibration uses it).
    model: RelevanceModel | None = None
    # Also run "Yak + LLM judge": the default recall, then the configured LLM's judgement
    # (services.recall.LLMRecallJudge, YAK_RECALL_LLM_JUDGE); needs YAK_LLM_BASE_URL.
    llm_judge: bool = False


@dataclass(frozen=True)
class Method:
    """One retrieval method under evaluation."""

    name: str
    kind: MethodKind
    params: RecallParams | None = None
    note: str = ""


@dataclass
class _Conversation:
    """A conversation as ingested: its user, its clock, and which turns each memory holds."""

    source: Conversation
    user_id: str
    now: datetime
    memory_turns: dict[str, frozenset[str]] = field(default_factory=dict)
    distillation_turns: dict[str, frozenset[str]] = field(default_factory=dict)
    # Turns some recallable (active) distillation holds: what Yak's recall can find at best.
    recallable_turns: frozenset[str] = frozenset()


def _quiet(_: str) -> None:
    """A progress sink that drops every line."""


def user_id_for(index: int, sample_id: str) -> str:
    """A valid Yak user id for conversation ``index`` (``sample_id`` made safe, made unique)."""
    safe = _USER_ID_UNSAFE.sub("-", sample_id).strip("-._@") or "conversation"
    return f"locomo{index}-{safe}"[:64]


def build_methods(settings: Settings, options: EvalOptions) -> list[Method]:
    """BM25, dense and Yak (the default recall), and with ``options.ablations`` variants of Yak."""
    depth = max(options.ks)
    base = recall_params(settings, threshold=options.threshold, limit=depth)
    methods = [
        Method("BM25", "bm25", note="Okapi BM25 over raw exchanges (PostgreSQL full text)"),
        Method("dense", "dense", note="exact cosine over raw exchanges, same embedder"),
        Method(YAK, "yak", base, note="the default recall: calibrated relevance, tier gate, decay, warmth, gravity"),
    ]
    if options.llm_judge:
        methods.append(Method(YAK_JUDGED, "yak_judged", base,
                              note="the default recall, then the LLM drops what it judges irrelevant"))
    if options.ablations:
        def variant(name: str, params: RecallParams) -> Method:
            return Method(name, "yak", params)

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


def _ingest(db: Database, settings: Settings, embedder: Embedder, conversations: Sequence[Conversation],
            progress: Progress) -> tuple[list[_Conversation], dict[str, Any]]:
    """Every conversation through the pipeline's own functions; returns the turn mapping and stage times."""
    llm = get_llm_provider(settings)
    job = DistillJob(db=db, llm=llm, embedder=embedder, prompt_version=settings.prompt_version, alerter=NULL_ALERTER)
    consolidate = ConsolidateJob(db=db, llm=llm, embedder=embedder, alerter=NULL_ALERTER,
                                 concurrency=settings.llm_concurrency)
    seconds = {"ingest": 0.0, "distill": 0.0, "conflicts": 0.0, "merge": 0.0, "exchange_vectors": 0.0}
    counts = {"turns": 0, "memories": 0, "duplicate_turns": 0, "rejected_turns": 0, "distilled": 0,
              "distill_failed": 0, "conflicts": 0, "merges": 0}
    # The LLM's calls per stage: who answered, how fast, how often its answer was valid.
    llm_stages = {"distil": StageReport(), "conflicts": StageReport(), "merge": StageReport()}
    ingested: list[_Conversation] = []
    total_turns = sum(len(c.turns) for c in conversations)
    for index, conversation in enumerate(conversations):
        user_id = user_id_for(index, conversation.sample_id)
        started = time.monotonic()
        records = [ExchangeRecord(user_id=user_id, content=t.exchange(), occurred_at=t.occurred_at, line=i + 1)
                   for i, t in enumerate(conversation.turns)]
        # "Now" for ingestion is after the conversation, so no session counts as in the future.
        report = ingest_records(db, records, source="import", source_ref=f"locomo:{conversation.sample_id}",
                                now=conversation.last_session_at + timedelta(days=1))
        if report.rejected:
            counts["rejected_turns"] += len(report.rejected)
            progress(f"{conversation.sample_id}: {len(report.rejected)} turns rejected, e.g. {report.rejected[0].reason}")
        with db.connection() as conn:
            rows = list_memories(conn, user_id=user_id, limit=len(records) + 1)
        by_hash = {r["content_sha256"]: str(r["id"]) for r in rows}
        memory_turns: dict[str, set[str]] = {}
        for turn in conversation.turns:
            memory_id = by_hash.get(content_sha256(turn.exchange()))
            if memory_id is not None:
                memory_turns.setdefault(memory_id, set()).add(turn.dia_id)
        seconds["ingest"] += time.monotonic() - started
        counts["turns"] += len(records)
        counts["memories"] += len(report.stored)
        counts["duplicate_turns"] += len(report.duplicates)
        progress(f"[{index + 1}/{len(conversations)}] {conversation.sample_id}: {len(records)} turns → "
                 f"{len(report.stored)} exchanges stored as user {user_id}")

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
                     f"({done}/{total_turns} overall, {rate:.1f}/s, provider {llm.name})")
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

        started = time.monotonic()
        embed_pending_exchanges(
            db, embedder, user_id=user_id,
            on_progress=lambda n, total=len(memory_turns), u=user_id: progress(f"  embedded {n}/{total} exchanges of {u}"))
        seconds["exchange_vectors"] += time.monotonic() - started
        ingested.append(_Conversation(
            source=conversation, user_id=user_id, now=conversation.last_session_at + timedelta(days=1),
            memory_turns={m: frozenset(t) for m, t in memory_turns.items()},
        ))
    with db.connection() as conn:
        statuses = status_counts(conn)
    counts["distillations_by_status"] = {k: int(v) for k, v in sorted(statuses.items())}
    return ingested, {"seconds": {k: round(v, 2) for k, v in seconds.items()}, "counts": counts,
                      "llm_provider": llm.name, "llm": {name: llm_summary(stage) for name, stage in llm_stages.items()}}


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


def _retrieve(conn: Any, method: Method, conversation: _Conversation, question: Question, vector: Sequence[float],
              embedder: Embedder, depth: int, model: RelevanceModel | None,
              judge: LLMRecallJudge | None = None) -> list[frozenset[str]]:
    """The method's ranked items for one question, each as the set of turns it holds."""
    if method.kind == "bm25":
        hits = bm25_search(conn, table="memories", user_id=conversation.user_id, query=question.question, limit=depth)
        return [conversation.memory_turns.get(h.id, frozenset()) for h in hits]
    if method.kind == "dense":
        hits = vector_search(conn, table="memories", user_id=conversation.user_id, query_embedding=vector,
                             embedding_model=embedder.model_name, limit=depth, exact=True)
        return [conversation.memory_turns.get(h.id, frozenset()) for h in hits]
    assert method.params is not None and model is not None
    ranked = recall(conn, user_id=conversation.user_id, query=question.question, query_embedding=vector,
                    embedding_model=embedder.model_name, params=method.params, model=model, now=conversation.now)
    ids = [r.id for r in ranked]
    if method.kind == "yak_judged" and judge is not None and ids:
        contents = recall_hit_rows(conn, ids)
        kept = judge.kept(question.question, [contents[i][2] for i in ids])
        if kept is not None:
            ids = [ids[i] for i, _ in kept]
    return _distillation_turns(conn, conversation, ids)


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


def run_locomo_eval(settings: Settings, conversations: Sequence[Conversation], options: EvalOptions = EvalOptions(),
                    *, progress: Progress = _quiet, data_label: str = "") -> dict[str, Any]:
    """Run the whole evaluation and return the report (see ``yak_pipeline.eval.report`` for its output)."""
    if not options.ks or any(k < 1 for k in options.ks):
        raise ValueError(f"ks must be positive integers, got {list(options.ks)}")
    ks = tuple(sorted(set(options.ks)))
    depth = max(ks)
    embedder = get_embedder(settings)
    methods = build_methods(settings, replace(options, ks=ks))
    model = options.model or relevance_model(settings, embedder)
    judge = None
    if options.llm_judge:
        if not settings.llm_base_url:
            raise ValueError("--llm-judge needs an LLM endpoint: set YAK_LLM_BASE_URL (or use --local-llm)")
        judge = LLMRecallJudge.from_settings(settings, get_llm_provider(settings))
    started = time.monotonic()
    with evaluation_database(settings, keep=options.keep_database, progress=progress) as db:
        ingested, pipeline = _ingest(db, settings, embedder, conversations, progress)
        for conversation in ingested:
            with db.connection() as conn:
                ids = active_distillation_ids(conn, user_id=conversation.user_id, embedding_model=embedder.model_name)
                held = _distillation_turns(conn, conversation, ids)
            conversation.recallable_turns = frozenset().union(*held) if held else frozenset()
        coverage = [len(q.evidence & c.recallable_turns) / len(q.evidence) for c in ingested for q in c.source.questions]
        results: dict[str, list[ScoredQuestion]] = {m.name: [] for m in methods}
        current_first_scores: dict[str, list[float]] = {m.name: [] for m in methods}
        abstained_scores: dict[str, list[float]] = {m.name: [] for m in methods}
        latency_ms: dict[str, list[float]] = {m.name: [] for m in methods}
        total = sum(len(c.source.questions) for c in ingested)
        asked = 0
        query_started = time.monotonic()
        for conversation in ingested:
            questions = conversation.source.questions
            vectors = [embedder.embed_query(q.question) for q in questions]
            for question, vector in zip(questions, vectors):
                for method in methods:
                    with db.connection() as conn:
                        began = time.perf_counter()
                        items = _retrieve(conn, method, conversation, question, vector, embedder, depth, model,
                                          judge)
                        latency_ms[method.name].append((time.perf_counter() - began) * 1000)
                    results[method.name].append(ScoredQuestion(
                        question.category, score_ranking(items, question.evidence, ks)))
                    if question.category == KNOWLEDGE_UPDATE_CATEGORY and question.superseded:
                        current_first_scores[method.name].append(
                            current_first(items, question.evidence, question.superseded, k=5))
                asked += 1
                if asked % 50 == 0 or asked == total:
                    rate = asked / max(time.monotonic() - query_started, 1e-9)
                    progress(f"asked {asked}/{total} questions of {len(methods)} methods ({rate:.1f} questions/s)")
            never_said = conversation.source.never_said
            for question, vector in zip(never_said, [embedder.embed_query(q.question) for q in never_said]):
                for method in methods:
                    with db.connection() as conn:
                        items = _retrieve(conn, method, conversation, question, vector, embedder, depth, model,
                                          judge)
                    abstained_scores[method.name].append(abstained(items))
    method_reports: dict[str, dict] = {}
    for method in methods:
        summary = aggregate(results[method.name], ks)
        samples = sorted(latency_ms[method.name])
        method_reports[method.name] = {
            "kind": method.kind,
            "note": method.note,
            "overall": summary.pop("overall"),
            "by_category": summary,
            "latency_ms": {"p50": round(_percentile(samples, 50), 2), "p95": round(_percentile(samples, 95), 2)},
            "knowledge_update_current_first": _mean_or_none(current_first_scores[method.name]),
            "knowledge_update_n": len(current_first_scores[method.name]),
            "abstention_empty": _mean_or_none(abstained_scores[method.name]),
            "abstention_n": len(abstained_scores[method.name]),
        }
    default_method = YAK
    main = [m.name for m in methods if m.name in (*BASELINES, YAK, YAK_JUDGED)]
    skipped: dict[str, int] = {}
    for conversation in conversations:
        for key, value in conversation.skipped.items():
            skipped[key] = skipped.get(key, 0) + value
    return {
        "data": data_label,
        "conversations": len(conversations),
        "turns": sum(len(c.turns) for c in conversations),
        "questions": {"scored": sum(len(c.questions) for c in conversations), "skipped": skipped},
        "categories": {str(k): v for k, v in CATEGORY_NAMES.items() if k != 5},
        "ks": list(ks),
        "settings": {
            "embedder": embedder.model_name, "llm_provider": pipeline["llm_provider"],
            "threshold": options.threshold, "half_life_days": settings.half_life_days,
            "decay_enabled": settings.decay_enabled, "core_threshold_multiplier": settings.core_threshold_multiplier,
            "relevance_model": model.version, "relevance_exponent": settings.recall_relevance_exponent,
            "superseded_factor": settings.recall_superseded_factor, "leg_size": settings.recall_leg_size,
            "exchange_context": settings.recall_exchange_context,
        },
        "default_method": default_method,
        "methods": {name: method_reports[name] for name in main},
        "ablations": {name: method_reports[name] for name in method_reports if name not in main},
        "target": _target(method_reports, default_method, depth, options.required_points),
        # The mean share of a question's evidence turns held by an active distillation: no
        # recall of distillations can score a higher Recall@k, whatever its ranking.
        "recallable_evidence": round(sum(coverage) / len(coverage), 4) if coverage else 0.0,
        "pipeline": pipeline,
        "seconds": round(time.monotonic() - started, 1),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _mean_or_none(values: Sequence[float]) -> float | None:
    """The mean, rounded, or None when there is nothing to average (the measure does not apply)."""
    return round(sum(values) / len(values), 4) if values else None


def _percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted values (0 for none)."""
    if not sorted_values:
        return 0.0
    rank = max(1, min(len(sorted_values), round(pct / 100 * len(sorted_values) + 0.5)))
    return float(sorted_values[rank - 1])
