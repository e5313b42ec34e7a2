"""Conflict scores, near-duplicate versions and warmth as Dagster assets."""

from collections.abc import Callable
from datetime import date

import dagster as dg
from pydantic import Field

from yak_pipeline.defs.distillations.assets import distillations
from yak_pipeline.defs.partitions import partitions_label, run_partitions, users_partitions
from yak_pipeline.defs.resources import AlertsResource, EmbedderResource, LLMResource, PostgresResource
from yak_pipeline.services.consolidate import ConsolidateJob, merge_near_duplicates, score_conflicts
from yak_pipeline.services.reports import StageReport
from yak_pipeline.services.warmth import WarmthJob, evaluate_pending_turns, offline_judge, reevaluate_recent
from yak_pipeline.store.partition_gates import partition_gate_passed
from yak_pipeline.wiring import build_parts


def _held_back(context: dg.AssetExecutionContext, postgres: PostgresResource, user_id: str, day: date) -> bool:
    """Whether the quality gate of the user's day last failed: its work waits until the gate passes."""
    with postgres.database().connection() as conn:
        passed = partition_gate_passed(conn, user_id=user_id, day=day)
    if passed is False:
        context.log.warning("quality gate failed for %s on %s: holding back until it passes", user_id, day)
        return True
    return False


def _job(postgres: PostgresResource, llm: LLMResource, embedder: EmbedderResource, alerts: AlertsResource) -> ConsolidateJob:
    # The merge stage's look-ahead calls the LLM for several pairs at once, as the distiller does.
    return ConsolidateJob(db=postgres.database(), llm=llm.provider(), embedder=embedder.embedder(),
                          alerter=alerts.alerter(), concurrency=llm.max_concurrency())


def _consolidation_step(context: dg.AssetExecutionContext, what: str, step: Callable[..., StageReport],
                        postgres: PostgresResource, llm: LLMResource, embedder: EmbedderResource,
                        alerts: AlertsResource) -> dg.MaterializeResult:
    """Run ``step`` (conflict scoring or merging) on each of the run's days whose quality gate
    does not hold it back."""
    total, held = StageReport(), 0
    with alerts.database_guard(f"{what} of {partitions_label(context)}"):
        with postgres.database().connection() as conn:
            covered = run_partitions(context, conn)
        job: ConsolidateJob | None = None  # made for the first day with work to do
        for user_id, day in covered:
            if _held_back(context, postgres, user_id, day):
                held += 1
                continue
            job = job or _job(postgres, llm, embedder, alerts)
            total.merge(step(job, user_id=user_id, day=day))
    if held and held == len(covered):
        return dg.MaterializeResult(metadata={"held_back_by_quality_gate": True, "rows_in": 0, "rows_out": 0})
    metadata: dict[str, float | int | str] = dict(total.metadata())
    if held:
        metadata["days_held_back_by_quality_gate"] = held
    return dg.MaterializeResult(metadata=metadata)


def _consolidation_asset(name: str, *, deps: list[dg.AssetsDefinition], what: str,
                         step: Callable[..., StageReport], description: str) -> dg.AssetsDefinition:
    """A partitioned asset that runs one consolidation ``step`` (conflict scoring or merging) over
    its run's days (:func:`_consolidation_step`); both stages need the same four resources."""

    @dg.asset(name=name, partitions_def=users_partitions, deps=deps, group_name="memory", kinds={"postgres"},
              description=description)
    def _asset(context: dg.AssetExecutionContext, postgres: PostgresResource, llm: LLMResource,
               embedder: EmbedderResource, alerts: AlertsResource) -> dg.MaterializeResult:
        return _consolidation_step(context, what, step, postgres, llm, embedder, alerts)

    return _asset


conflict_scores = _consolidation_asset(
    "conflict_scores", deps=[distillations], what="scoring conflicts", step=score_conflicts,
    description="""Contradiction scores of each new distillation against the user's similar active ones.

A score above 0.7 records a conflict, flags both distillations for review, keeps them from
being merged, and raises a ``conflict_detected`` alert.""")

distillation_versions = _consolidation_asset(
    "distillation_versions", deps=[conflict_scores], what="merging near-duplicates", step=merge_near_duplicates,
    description="""Near-duplicates consolidated into versions instead of overwritten.

For each new distillation, the nearest of the user's active ones with similarity ≥ 0.85
(top 5, never one it conflicts with) is consolidated with it by the LLM: the older one gets
a new version recording ``merged_from``, the newer one becomes ``merged``. Old text stays in
the version history.""")


class WarmthConfig(dg.Config):
    """Run options for the warmth asset."""

    nightly: bool = Field(
        default=False, description="Re-evaluate every turn of the last days (the nightly pass), not only pending ones.")
    days: int = Field(default=7, ge=1, le=90, description="How many days back the nightly pass looks.")


@dg.asset(partitions_def=users_partitions, group_name="memory", kinds={"postgres"})
def warmth(
    context: dg.AssetExecutionContext,
    config: WarmthConfig,
    postgres: PostgresResource,
    llm: LLMResource,
    embedder: EmbedderResource,
    alerts: AlertsResource,
) -> dg.MaterializeResult:
    """How useful each recalled memory was, learnt from the turns of one user's days.

    For every recalled memory of a pending turn the evaluator (the LLM; offline, recall's
    calibrated relevance of the memory to the turn) scores usefulness 0–1: above 0.7
    warms it by 0.1, below 0.3 cools it by 0.2, clamped to [0, 1]; every change is a
    ``warmth_events`` row. The nightly pass re-runs this over the last 7 days, catching memories
    recalled but never evaluated; a (turn, memory) pair is only ever counted once.

    Why it stands alone in the lineage graph: its input is the turns clients post to
    ``/api/turns`` (a table, not an asset; the ``turns_sensor`` starts these runs), and what it
    changes is the warmth of distillations recalled in those turns, which may come from any
    day's ``distillations``, not this run's days'. An edge from ``distillations`` would claim
    a same-day dependency that does not exist.
    """
    report = StageReport()
    with alerts.database_guard(f"evaluating warmth of {partitions_label(context)}"):
        # The parts the offline judge scores with: the LLM resource's settings (recall's among them), its
        # provider and the embedder.
        parts = build_parts(llm.settings(), llm=llm.provider(), embedder=embedder.embedder())
        job = WarmthJob(db=postgres.database(), llm=parts.llm, alerter=alerts.alerter(), judge=offline_judge(parts))
        with postgres.database().connection() as conn:
            covered = run_partitions(context, conn)
        for user_id, day in covered:
            if config.nightly:
                report.merge(reevaluate_recent(job, user_id=user_id, day=day, days=config.days))
            else:
                report.merge(evaluate_pending_turns(job, user_id=user_id, day=day))
    return dg.MaterializeResult(metadata=report.metadata())
