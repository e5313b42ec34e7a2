"""One data file's figures: every method's ranking metrics, the extra measures, the block, the target.

Besides the ranking metrics (over categories 1-4, overall, per category and per ability where the
file names abilities), two measures of what a memory system must get right beyond ranking:

- ``knowledge_update_current_first`` — over knowledge-update questions (category 2 with a known
  superseded statement): the share whose evidence turn is in the top 5 and above the superseded one;
- ``abstention_empty`` — over never-said questions (category 5 without evidence): the share whose
  recall, threshold applied, is empty. Dense always returns something (0); BM25 returns nothing
  when no word of the question is in any exchange, which counts as abstaining.

And for each Yak method but the ablations, the block measures (``eval.block_measures``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from yak_pipeline.embeddings import Embedder
from yak_pipeline.eval.block_measures import BlockRow, BlockSpec, block_report, block_rows
from yak_pipeline.eval.collection import AskedQuestion, CollectedFile
from yak_pipeline.eval.locomo import KNOWLEDGE_UPDATE_CATEGORY
from yak_pipeline.eval.methods import BASELINES, YAK, Method
from yak_pipeline.eval.metrics import (
    ScoredQuestion,
    abstained,
    aggregate,
    current_first,
    mean_or_none,
    percentile,
    score_ranking,
)
from yak_pipeline.eval.ranking import RunModels, ranked_items
from yak_pipeline.services.recall_judge import LLMRecallJudge


@dataclass
class _MethodTally:
    """One method's per-question scores over a file, gathered before they are averaged."""

    results: list[ScoredQuestion] = field(default_factory=list)
    # The ranking metrics per ability, where the file names abilities (BEAM's).
    by_ability: dict[str, list[ScoredQuestion]] = field(default_factory=dict)
    # One row per answerable question: the cut block and the fixed one.
    blocks: dict[str, list[BlockRow]] = field(default_factory=lambda: {"block": [], "fixed_block": []})
    current_first: list[float] = field(default_factory=list)
    abstained: list[float] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)


def _score_question(tally: _MethodTally, asked: AskedQuestion, items: Sequence[frozenset[str]], ms: float,
                    ks: tuple[int, ...]) -> None:
    """Add one method's ranking of one question to its tally: abstention for a never-said question,
    else the ranking metrics, the latency and (a knowledge update) current first."""
    question = asked.question
    if not question.evidence:
        tally.abstained.append(abstained(items))
        return
    tally.latency_ms.append(ms)
    scored = ScoredQuestion(question.category, score_ranking(items, question.evidence, ks))
    tally.results.append(scored)
    if question.ability is not None:
        tally.by_ability.setdefault(question.ability, []).append(scored)
    if question.category == KNOWLEDGE_UPDATE_CATEGORY and question.superseded:
        tally.current_first.append(current_first(items, question.evidence, question.superseded, k=5))


def _tally_methods(collected: CollectedFile, methods: Sequence[Method], models: RunModels, embedder: Embedder,
                   judge: LLMRecallJudge | None, ks: tuple[int, ...],
                   block: BlockSpec) -> tuple[dict[str, _MethodTally], set[str]]:
    """Every method's tally over the file's questions, and the methods that had no model."""
    tallies = {m.name: _MethodTally() for m in methods}
    missing: set[str] = set()
    for asked in collected.asked:
        for method in methods:
            got = ranked_items(method, asked, collected, models, embedder, judge)
            if got is None:
                missing.add(method.name)
                continue
            items, ms, ranked = got
            if ranked is not None and not method.live and asked.question.evidence:
                for name, row in block_rows(collected.db, asked, ranked, items, block).items():
                    tallies[method.name].blocks[name].append(row)
            _score_question(tallies[method.name], asked, items, ms, ks)
    return tallies, missing


def _method_report(method: Method, tally: _MethodTally, ks: tuple[int, ...]) -> dict[str, Any]:
    """One method's section of the file report: its metrics averaged, its latency, its extra measures."""
    summary = aggregate(tally.results, ks)
    samples = sorted(tally.latency_ms)
    report: dict[str, Any] = {
        "kind": method.kind,
        "model": method.model if method.kind != "bm25" and method.kind != "dense" else None,
        "note": method.note,
        "overall": summary.pop("overall"),
        "by_category": summary,
        "by_ability": {ability: aggregate(scored, ks)["overall"] for ability, scored in sorted(tally.by_ability.items())},
        "latency_ms": {"p50": round(percentile(samples, 50), 2), "p95": round(percentile(samples, 95), 2)},
        "knowledge_update_current_first": mean_or_none(tally.current_first),
        "knowledge_update_n": len(tally.current_first),
        "abstention_empty": mean_or_none(tally.abstained),
        "abstention_n": len(tally.abstained),
    }
    if tally.blocks["block"]:
        report["block"] = block_report(tally.blocks["block"])
        report["fixed_block"] = block_report(tally.blocks["fixed_block"])
    return report


def file_report(collected: CollectedFile, methods: Sequence[Method], models: RunModels, embedder: Embedder,
                judge: LLMRecallJudge | None, ks: tuple[int, ...], required_points: float,
                block: BlockSpec) -> dict[str, Any]:
    """One file's figures: every method overall and per category, the extra measures, the block
    (Yak methods but the ablations), the target."""
    tallies, missing = _tally_methods(collected, methods, models, embedder, judge, ks, block)
    method_reports = {m.name: _method_report(m, tallies[m.name], ks) for m in methods if m.name not in missing}
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
