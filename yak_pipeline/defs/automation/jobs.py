"""Jobs the sensors and the schedule launch."""

import dagster as dg

from yak_pipeline.defs.partitions import users_partitions
from yak_pipeline.defs.resources import PostgresResource
from yak_pipeline.store.user_indexes import USER_INDEX_MIN_ROWS, describe_build

memory_job = dg.define_asset_job(
    "memory_job",
    selection=dg.AssetSelection.assets("raw_exchanges", "distillations", "conflict_scores", "distillation_versions")
    | dg.AssetSelection.checks_for_assets("distillations"),
    partitions_def=users_partitions,
    # The steps form one chain, so a process per step buys nothing but start-up time
    # (several seconds of imports each); the run worker executes them in turn.
    executor_def=dg.in_process_executor,
    description="Raw exchanges → distillations (quality gate) → conflict scores → versions, for one user's days "
                "(the run's tags name them).",
)

warmth_job = dg.define_asset_job(
    "warmth_job",
    selection=dg.AssetSelection.assets("warmth"),
    partitions_def=users_partitions,
    executor_def=dg.in_process_executor,
    description="Per-turn warmth evaluation for one user's days (the run's tags name them).",
)


class RecallIndexConfig(dg.Config):
    """How many live vectors in a column make a user heavy enough for their own index there."""

    min_rows: int = USER_INDEX_MIN_ROWS


@dg.op
def maintain_recall_indexes_op(context: dg.OpExecutionContext, config: RecallIndexConfig,
                               postgres: PostgresResource) -> list[str]:
    """Folds BM25's statistics and builds their own HNSW indexes for users with many memories (and
    drops those no longer needed).

    Recall is the same without either, only slower for heavy users (sql/014, store.user_indexes,
    docs/BENCHMARKS.md); the builds are concurrent, so ingestion and recall go on meanwhile.
    """
    from yak_pipeline.services.recall_indexes import maintain_recall_indexes

    built = maintain_recall_indexes(postgres.database(), min_rows=config.min_rows,
                                    on_build=lambda *build: context.log.info(describe_build(*build)))
    context.log.info("per-user recall indexes built: %s", ", ".join(built) or "none needed")
    context.add_output_metadata({"built": len(built), "indexes": ", ".join(built)})
    return built


@dg.job(executor_def=dg.in_process_executor,
        description="Per-user HNSW indexes for users with many memories (nightly, store.user_indexes).")
def recall_index_job() -> None:
    """Recall index maintenance: one op, no partitions."""
    maintain_recall_indexes_op()
