"""Jobs the sensors and the schedule launch."""

import dagster as dg

from yak_pipeline.defs.partitions import exchange_partitions

memory_job = dg.define_asset_job(
    "memory_job",
    selection=dg.AssetSelection.assets("raw_exchanges", "distillations", "conflict_scores", "distillation_versions")
    | dg.AssetSelection.checks_for_assets("distillations"),
    partitions_def=exchange_partitions,
    # The steps form one chain, so a process per step buys nothing but start-up time
    # (several seconds of imports each); the run worker executes them in turn.
    executor_def=dg.in_process_executor,
    description="Raw exchanges → distillations (quality gate) → conflict scores → versions, for one user's day.",
)

warmth_job = dg.define_asset_job(
    "warmth_job",
    selection=dg.AssetSelection.assets("warmth"),
    partitions_def=exchange_partitions,
    executor_def=dg.in_process_executor,
    description="Per-turn warmth evaluation for one user's day.",
)

