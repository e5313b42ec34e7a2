"""Run the LoCoMo retrieval evaluation: a fresh database, the real pipeline, four methods, metrics.

1. A new database ``yak_eval_<random>`` is created on the configured server (never the user's
   data) and migrated for the configured embedder; it is dropped at the end, also on Ctrl-C or
   an error, unless asked to keep it.
2. Each conversation is one user. Its turns go through the real pipeline code: ``ingest_records``
   (one exchange per turn, dated by its session), ``distill_memories`` with the configured LLM
   provider (the offline rules provider when none is set) and embedder, the confidence gate, then
   ``score_conflicts`` and ``merge_near_duplicates``; finally every exchange gets its vector
   (``embed_pending_exchanges``), as hybrid recall needs.
3. Every scored question is asked of each method as of the day after the conversation's last
   session (``now`` = last session time + 1 day), and the ranking is scored against its evidence.

Methods, all on the same database and the same question embeddings:

- **BM25** — Okapi BM25 over the raw exchanges (PostgreSQL full text, ``store.hybrid.bm25_search``);
- **dense** — exact cosine similarity over the raw exchanges' vectors, same embedder;
- **Yak** — the vector-only recall of DESIGN §4 (``store.recall.recall``): gate, decay, warmth, gravity;
- **Yak hybrid** — ``store.hybrid.hybrid_recall`` with the configured fusion settings.

Optional ablations re-run Yak hybrid (and Yak) with one thing changed each (decay off, other
half-lives, one kind of leg only, no gate) on the same data, to show what each part contributes.
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
from yak_pipeline.eval.locomo import CATEGORY_NAMES, Conversation, Question
from yak_pipeline.eval.metrics import ScoredQuestion, aggregate, score_ranking
from yak_pipeline.llm import get_llm_provider
from yak_pipeline.services.consolidate import ConsolidateJob, merge_near_duplicates, score_conflicts
from yak_pipeline.services.distill import DistillJob, distill_memories, partition_memory_ids
from yak_pipeline.services.ingest import ingest_records
from yak_pipeline.services.recall import configured_hybrid_params, embed_pending_exchanges, recall_params
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database, connect, resolve_database_url, with_database
from yak_pipeline.store.errors import StoreError
from yak_pipeline.store.hybrid import (
    active_distillation_ids,
    bm25_search,
    hybrid_recall,
    source_memories,
    vector_search,
)
from yak_pipeline.store.memories import list_memories
from yak_pipeline.store.recall import RecallParams, recall

Progress = Callable[[str], None]
MethodKind = Literal["bm25", "dense", "yak", "hybrid"]

BASELINES = ("BM25", "dense")
YAK = "Yak"
YAK_HYBRID = "Yak hybrid"
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
    """The four methods, and with ``options.ablations`` the variants of Yak and Yak hybrid."""
    depth = max(options.ks)
    base = recall_params(settings, threshold=options.threshold, limit=depth)
    configured = configured_hybrid_params(settings)
    vector_only = replace(base, hybrid=None)
    hybrid = replace(base, hybrid=configured)
    methods = [
        Method("BM25", "bm25", note="Okapi BM25 over raw exchanges (PostgreSQL full text)"),
        Method("dense", "dense", note="exact cosine over raw exchanges, same embedder"),
        Method(YAK, "yak", vector_only, note="vector-only recall of DESIGN §4"),
        Method(YAK_HYBRID, "hybrid", hybrid, note="BM25 + vectors over distillations and exchanges, RRF, §4 score"),
    ]
    if options.ablations:
        def variant(name: str, params: RecallParams, kind: MethodKind = "hybrid", note: str = "") -> Method:
            return Method(name, kind, params, note)

        methods += [
            variant("Yak hybrid, decay off", replace(hybrid, decay_enabled=False)),
            *[variant(f"Yak hybrid, half-life {days:g} d", replace(hybrid, decay_enabled=True, half_life_days=days))
              for days in (7.0, 30.0, 90.0, 365.0) if not (settings.decay_enabled and days == settings.half_life_days)],
            variant("Yak hybrid, no gate (t=0)", replace(hybrid, threshold=0.0)),
            *[variant(f"Yak hybrid, RRF k={k:g}", replace(hybrid, hybrid=replace(configured, rrf_k=k)))
              for k in (10.0, 60.0) if k != configured.rrf_k],
            *[variant(f"Yak hybrid, relevance exponent {e:g}",
                      replace(hybrid, hybrid=replace(configured, relevance_exponent=e)))
              for e in (1.0, 3.0) if e != configured.relevance_exponent],
            *[variant(f"Yak hybrid, exchange weight {w:g}", replace(hybrid, hybrid=replace(configured, exchange_weight=w)))
              for w in (1.0,) if w != configured.exchange_weight],
            variant("Yak hybrid, exchange context off",
                    replace(hybrid, hybrid=replace(configured, exchange_context=False))),
            variant("Yak hybrid, text legs only", replace(hybrid, hybrid=replace(configured, vector_weight=0.0))),
            variant("Yak hybrid, vector legs only", replace(hybrid, hybrid=replace(configured, text_weight=0.0))),
            variant("Yak hybrid, distillations only", replace(hybrid, hybrid=replace(configured, exchange_weight=0.0))),
            variant("Yak, decay off", replace(vector_only, decay_enabled=False), kind="yak"),
            variant("Yak, no gate (t=0)", replace(vector_only, threshold=0.0), kind="yak"),
        ]
    return methods


@contextmanager
def evaluation_database(settings: Settings, *, keep: bool = False, progress: Progress = _quiet) -> Iterator[Database]:
    """A new, migrated database on the configured server for this evaluation alone; dropped after."""
    from yak_pipeline.wiring import open_database

    server_url = resolve_database_url(settings)
    name = f"yak_eval_{uuid.uuid4().hex[:12]}"
    try:
        with connect(server_url, autocommit=True, vector=False) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
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
            with connect(server_url, autocommit=True, vector=False) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
            counts["distilled"] += stage.rows_out
            counts["distill_failed"] += stage.failed
            done = counts["distilled"] + counts["distill_failed"]
            rate = (offset + len(chunk)) / max(time.monotonic() - started, 1e-9)
            progress(f"  distilled {offset + len(chunk)}/{len(pending)} exchanges of {user_id} "
                     f"({done}/{total_turns} overall, {rate:.0f}/s, provider {llm.name})")
        seconds["distill"] += time.monotonic() - started

        started = time.monotonic()
        conflicts = score_conflicts(consolidate, user_id=user_id, day=None)
        seconds["conflicts"] += time.monotonic() - started
        started = time.monotonic()
        merges = merge_near_duplicates(consolidate, user_id=user_id, day=None)
        seconds["merge"] += time.monotonic() - started
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
        statuses = dict(conn.execute(
            "SELECT status, count(*) FROM distillations WHERE deleted_at IS NULL GROUP BY status").fetchall())
    counts["distillations_by_status"] = {k: int(v) for k, v in sorted(statuses.items())}
    return ingested, {"seconds": {k: round(v, 2) for k, v in seconds.items()}, "counts": counts,
                      "llm_provider": llm.name}


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
              embedder: Embedder, depth: int) -> list[frozenset[str]]:
    """The method's ranked items for one question, each as the set of turns it holds."""
    if method.kind == "bm25":
        hits = bm25_search(conn, table="memories", user_id=conversation.user_id, query=question.question, limit=depth)
        return [conversation.memory_turns.get(h.id, frozenset()) for h in hits]
    if method.kind == "dense":
        hits = vector_search(conn, table="memories", user_id=conversation.user_id, query_embedding=vector,
                             embedding_model=embedder.model_name, limit=depth, exact=True)
        return [conversation.memory_turns.get(h.id, frozenset()) for h in hits]
    assert method.params is not None
    if method.kind == "yak":
        ranked = recall(conn, user_id=conversation.user_id, query_embedding=vector,
                        embedding_model=embedder.model_name, params=method.params, now=conversation.now)
        ids = [r.id for r in ranked]
    else:
        assert method.params.hybrid is not None
        hits = hybrid_recall(conn, user_id=conversation.user_id, query=question.question, query_embedding=vector,
                             embedding_model=embedder.model_name, params=method.params,
                             hybrid=method.params.hybrid, now=conversation.now)
        ids = [h.id for h in hits]
    return _distillation_turns(conn, conversation, ids)


def _target(methods: dict[str, dict], default_method: str, depth: int) -> dict[str, Any]:
    """Issue 5's bar: the default recall's Recall@k ≥ the better baseline's + 5 points."""
    key = f"recall@{depth}"
    default = methods[default_method]["overall"][key]
    best_name = max(BASELINES, key=lambda name: methods[name]["overall"][key])
    best = methods[best_name]["overall"][key]
    margin = (default - best) * 100
    return {"metric": key, "default_method": default_method, "default": round(default, 4),
            "best_baseline": best_name, "baseline": round(best, 4), "margin_points": round(margin, 2),
            "required_points": 5.0, "met": margin >= 5.0}


def run_locomo_eval(settings: Settings, conversations: Sequence[Conversation], options: EvalOptions = EvalOptions(),
                    *, progress: Progress = _quiet, data_label: str = "") -> dict[str, Any]:
    """Run the whole evaluation and return the report (see ``yak_pipeline.eval.report`` for its output)."""
    if not options.ks or any(k < 1 for k in options.ks):
        raise ValueError(f"ks must be positive integers, got {list(options.ks)}")
    ks = tuple(sorted(set(options.ks)))
    depth = max(ks)
    embedder = get_embedder(settings)
    methods = build_methods(settings, replace(options, ks=ks))
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
                        items = _retrieve(conn, method, conversation, question, vector, embedder, depth)
                        latency_ms[method.name].append((time.perf_counter() - began) * 1000)
                    results[method.name].append(ScoredQuestion(
                        question.category, score_ranking(items, question.evidence, ks)))
                asked += 1
                if asked % 50 == 0 or asked == total:
                    rate = asked / max(time.monotonic() - query_started, 1e-9)
                    progress(f"asked {asked}/{total} questions of {len(methods)} methods ({rate:.1f} questions/s)")
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
        }
    default_method = YAK_HYBRID if settings.hybrid_recall else YAK
    main = [m.name for m in methods[:4]]
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
            "hybrid_recall": settings.hybrid_recall, "hybrid_rrf_k": settings.hybrid_rrf_k,
            "hybrid_relevance_exponent": settings.hybrid_relevance_exponent,
            "hybrid_text_weight": settings.hybrid_text_weight, "hybrid_vector_weight": settings.hybrid_vector_weight,
            "hybrid_exchange_weight": settings.hybrid_exchange_weight,
            "hybrid_exchange_context": settings.hybrid_exchange_context,
        },
        "default_method": default_method,
        "methods": {name: method_reports[name] for name in main},
        "ablations": {m.name: method_reports[m.name] for m in methods[4:]},
        "target": _target(method_reports, default_method, depth),
        # The mean share of a question's evidence turns held by an active distillation: no
        # recall of distillations can score a higher Recall@k, whatever its ranking.
        "recallable_evidence": round(sum(coverage) / len(coverage), 4) if coverage else 0.0,
        "pipeline": pipeline,
        "seconds": round(time.monotonic() - started, 1),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted values (0 for none)."""
    if not sorted_values:
        return 0.0
    rank = max(1, min(len(sorted_values), round(pct / 100 * len(sorted_values) + 0.5)))
    return float(sorted_values[rank - 1])
