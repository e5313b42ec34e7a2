"""Distillations as a Dagster asset."""

import dagster as dg
from pydantic import Field

from yak_pipeline.defs.exchanges.assets import raw_exchanges
from yak_pipeline.defs.partitions import partitions_label, run_partitions, users_partitions
from yak_pipeline.defs.resources import AlertsResource, EmbedderResource, LLMResource, PostgresResource
from yak_pipeline.services.distill import DistillJob, distill_memories, partition_memory_ids


class DistillationsConfig(dg.Config):
    """Run options for the distillations asset."""

    redistill_outdated: bool = Field(
        default=True, description="Also re-distil memories whose distillation came from an older prompt/schema version.")


@dg.asset(partitions_def=users_partitions, deps=[raw_exchanges], group_name="memory", kinds={"postgres"})
def distillations(
    context: dg.AssetExecutionContext,
    config: DistillationsConfig,
    postgres: PostgresResource,
    llm: LLMResource,
    embedder: EmbedderResource,
    alerts: AlertsResource,
) -> dg.MaterializeResult:
    """1–4 factual sentences per exchange, with a confidence and a tier, embedded and gated.

    Distils every ``pending`` memory of the run's days of the user (and, for a backfill after a prompt
    change, every memory distilled by an older ``YAK_PROMPT_VERSION``, writing a new version
    and keeping the old text). Confidence ≥ 0.8 → active; 0.6–0.8 → active and flagged for
    review; < 0.6 → review only, never recalled. A memory whose distillation fails stays
    ``pending`` with its error recorded and an alert, and the next run retries it.
    """
    settings = llm.settings()
    with alerts.database_guard(f"distilling {partitions_label(context)}"):
        job = DistillJob(db=postgres.database(), llm=llm.provider(), embedder=embedder.embedder(),
                         prompt_version=settings.prompt_version, alerter=alerts.alerter())
        with job.db.connection() as conn:
            covered = run_partitions(context, conn)
        # All the run's days' memories go through one call: its workers, embedding batches and
        # context vectors are shared by all its days.
        memory_ids = [memory_id for user_id, day in covered
                      for memory_id in partition_memory_ids(job.db, user_id=user_id, day=day,
                                                            include_outdated=config.redistill_outdated,
                                                            prompt_version=settings.prompt_version)]
        report = distill_memories(job, memory_ids, concurrency=llm.max_concurrency())
    if report.failed:
        context.log.warning("%d of %d memories failed to distil and stay pending: %s", report.failed,
                            report.rows_in, report.errors[0])
    return dg.MaterializeResult(metadata={**report.metadata(), "llm_provider": job.llm.name,
                                          "prompt_version": settings.prompt_version})
