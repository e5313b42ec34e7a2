"""Run the LoCoMo retrieval evaluation: fresh databases, the real pipeline, the methods, metrics.

1. Each data file gets a new database (``eval.scratch_database``: never the user's data), and its
   conversations go through the real pipeline code, one user each (``eval.ingest``: the chosen
   distiller — ``rules``: the offline rules provider; ``local``: the packaged local model;
   ``llm``: ``YAK_LLM_BASE_URL``; ``none`` — then the exchange and context vectors).
2. Every question is asked once, as of the day after the conversation's last session
   (``eval.collection``): the baselines' rankings and the production candidates are collected
   once and kept, labelled with the turns they hold, and become the relevance model's examples
   (``eval.examples``, ``eval.calibrate``).
3. Relevance models are fitted on those examples, and every Yak figure is a pure re-ranking of the
   collected candidates with ``core.recall.rank_memories`` (what ``store.recall.recall`` does;
   ``eval.ranking``):

   - **Yak** — conversation-level K-fold cross-validation (``eval.cross_validation``): each
     conversation is ranked by a model fitted on the conversations of the other folds only
     (all files together; each file weighted equally, the classes equally). The figure decisions
     are made on, and the ``target`` line's;
   - **Yak (in-sample)** — one model fitted on every conversation given, ranked on the same ones
     (what ``yak eval calibrate`` writes);
   - **Yak (shipped model)** — the configured embedder's model as installed
     (``recall_models/<embedder>.json``, or ``$YAK_HOME``'s own fit).

Baselines, on the same databases and the same question embeddings: **BM25** (Okapi BM25 over the
raw exchanges, PostgreSQL full text) and **dense** (exact cosine over the raw exchanges' vectors,
same embedder). Optional ablations re-run the default recall live with one thing changed each
(``eval.methods``). Each file's figures — ranking metrics, knowledge updates, abstention, the
block — are ``eval.file_report``'s; this module runs the stages in order and assembles the report.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from yak_pipeline.core.relevance import RelevanceModel
from yak_pipeline.embeddings import Embedder
from yak_pipeline.eval.block_measures import BlockSpec
from yak_pipeline.eval.calibrate import Examples, fit_model
from yak_pipeline.eval.collection import collect
from yak_pipeline.eval.cross_validation import CrossValidation, cross_validate, cross_validation_report, evaluation_note
from yak_pipeline.eval.examples import examples_from
from yak_pipeline.eval.file_report import file_report
from yak_pipeline.eval.locomo import CATEGORY_NAMES, Conversation
from yak_pipeline.eval.methods import YAK, build_methods
from yak_pipeline.eval.options import Dataset, EvalOptions, Progress, quiet, resolve_distiller
from yak_pipeline.eval.ranking import RunModels
from yak_pipeline.services.recall import block_choice
from yak_pipeline.services.recall_judge import LLMRecallJudge
from yak_pipeline.settings import Settings
from yak_pipeline.wiring import YakParts, parts_of


def _checked(datasets: Sequence[Dataset], options: EvalOptions) -> tuple[list[str], EvalOptions]:
    """The files' labels and the options with their cut-offs sorted; ValueError for a bad run."""
    if not options.ks or any(k < 1 for k in options.ks):
        raise ValueError(f"ks must be positive integers, got {list(options.ks)}")
    if not datasets:
        raise ValueError("no data files")
    labels = [label for label, _ in datasets]
    if len(set(labels)) != len(labels):
        raise ValueError("the same data file is given twice")
    return labels, replace(options, ks=tuple(sorted(set(options.ks))))


def _llm_judge(parts: YakParts, options: EvalOptions) -> LLMRecallJudge | None:
    """The judge of "Yak + LLM judge" when asked for (it needs an LLM endpoint), else None."""
    if not options.llm_judge:
        return None
    if not parts.settings.llm_base_url:
        raise ValueError("--llm-judge needs an LLM endpoint: set YAK_LLM_BASE_URL (or use --distiller local)")
    return LLMRecallJudge.from_settings(parts.settings, parts.llm)


def _fit_in_sample(examples: Examples, settings: Settings, embedder: Embedder, distiller: str, labels: Sequence[str],
                   command: str, progress: Progress) -> tuple[RelevanceModel | None, str]:
    """The model fitted on every conversation (what ``yak eval calibrate`` writes), or None and why not."""
    try:
        return fit_model(examples, embedding_model=embedder.model_name, extra={
            "distiller": distiller, "leg_size": settings.recall_leg_size,
            "exchange_context": settings.recall_exchange_context,
            "command": command or ("yak eval calibrate " + " ".join(f"--data {label}" for label in labels)
                                   + f" --distiller {distiller}")}), ""
    except ValueError as exc:
        note = f"the in-sample model could not be fitted: {exc}"
        progress(note)
        return None, note


def _settings_report(settings: Settings, embedder: Embedder, distiller: str, llm_provider: str, options: EvalOptions,
                     models: RunModels, block: BlockSpec) -> dict[str, Any]:
    """The report's ``settings``: what the run recalled with, and which relevance models ranked."""
    shipped, in_sample, cv = models.shipped, models.in_sample, models.cross_validation
    return {
        "embedder": embedder.model_name, "distiller": distiller, "llm_provider": llm_provider,
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
    }


def run_evaluation(settings: YakParts | Settings, datasets: Sequence[Dataset], options: EvalOptions = EvalOptions(),
                   *, progress: Progress = quiet, command: str = "") -> tuple[dict[str, Any], RelevanceModel | None]:
    """The collection pass, the fits (cross-validated and in-sample) and every method's figures.

    Returns the report (``eval.report``) and the in-sample model (fitted on everything; None when
    it cannot be fitted), which ``yak eval calibrate`` writes. ``settings``: Yak's parts, or the
    settings to build them from.
    """
    labels, options = _checked(datasets, options)
    ks = options.ks
    parts = parts_of(settings)
    settings, embedder = parts.settings, parts.embedder
    distiller = resolve_distiller(settings, options.distiller)
    methods = build_methods(parts, options)
    shipped = options.model or parts.relevance_model
    judge = _llm_judge(parts, options)
    started = time.monotonic()
    with ExitStack() as stack:
        files = collect(parts, datasets, options, stack=stack, progress=progress)
        collected_at = time.monotonic()
        examples = examples_from(files)
        counts = [(f.label, len(f.ingested)) for f in files]
        in_sample, in_sample_note = _fit_in_sample(examples, settings, embedder, distiller, labels, command, progress)
        cv: CrossValidation | None = cross_validate(
            examples, counts, options.folds, embedding_model=embedder.model_name, fallback=in_sample or shipped,
            progress=progress) if options.folds >= 2 else None
        models = RunModels(shipped=shipped, in_sample=in_sample, cross_validation=cv)
        file_reports = {}
        block = BlockSpec(limit=settings.proxy_recall_limit, choice=block_choice(settings),
                          exponent=settings.recall_relevance_exponent)
        for collected in files:
            progress(f"{collected.label}: scoring {len(methods)} methods")
            file_reports[collected.label] = file_report(collected, methods, models, embedder, judge, ks,
                                                        options.required_points, block)
        fitted_at = time.monotonic()
    targets = {label: report["target"] for label, report in file_reports.items()}
    llm_provider = file_reports[labels[0]]["pipeline"]["llm_provider"]
    return {
        "data": labels,
        "distiller": distiller,
        "evaluation": evaluation_note(cv, files),
        "cross_validation": cross_validation_report(cv, files),
        "conversations": sum(r["conversations"] for r in file_reports.values()),
        "turns": sum(r["turns"] for r in file_reports.values()),
        "questions": {"scored": sum(r["questions"]["scored"] for r in file_reports.values()),
                      "never_said": sum(r["questions"]["never_said"] for r in file_reports.values())},
        "categories": {str(k): v for k, v in CATEGORY_NAMES.items() if k != 5},
        "ks": list(ks),
        "settings": _settings_report(settings, embedder, distiller, llm_provider, options, models, block),
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


def run_locomo_eval(settings: YakParts | Settings, data: Sequence[Dataset] | Sequence[Conversation],
                    options: EvalOptions = EvalOptions(), *, progress: Progress = quiet,
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
