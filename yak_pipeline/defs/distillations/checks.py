"""The blocking quality gate on distillations (Great Expectations)."""

import dagster as dg

from yak_pipeline.defs.distillations.assets import distillations
from yak_pipeline.defs.partitions import exchange_partitions, partition_parts
from yak_pipeline.defs.resources import EmbedderResource, PostgresResource
from yak_pipeline.services.quality import validate_distillations
from yak_pipeline.store.distillations import partition_distillations, record_partition_gate

DISTILLATION_QUALITY_CHECK = "distillation_quality"


@dg.asset_check(asset=distillations, name=DISTILLATION_QUALITY_CHECK, blocking=True, partitions_def=exchange_partitions)
def distillation_quality(
    context: dg.AssetCheckExecutionContext, postgres: PostgresResource, embedder: EmbedderResource
) -> dg.AssetCheckResult:
    """Confidence in [0, 1]; tier in core/medium/low; 1–4 sentences; an embedding of the right
    size; no active row under the 0.6 gate. A failure stops this run's downstream steps, and the
    verdict is stored so later runs hold back conflict scoring and merges for the partition too.
    """
    user_id, day = partition_parts(context.partition_key)
    dimensions = embedder.embedder().dimensions
    with postgres.database().connection() as conn:
        rows = partition_distillations(conn, user_id=user_id, day=day)
        outcome = validate_distillations(rows, dimensions=dimensions)
        record_partition_gate(conn, user_id=user_id, day=day, passed=outcome.passed, failures=outcome.failures)
    return dg.AssetCheckResult(
        passed=outcome.passed,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={"rows": outcome.rows, "failures": "; ".join(outcome.failures) or "none"},
    )
