"""The blocking quality gate on distillations (Great Expectations)."""

import dagster as dg

from yak_pipeline.defs.distillations.assets import distillations
from yak_pipeline.defs.partitions import run_partitions, users_partitions
from yak_pipeline.defs.resources import EmbedderResource, PostgresResource
from yak_pipeline.services.quality import validate_distillations
from yak_pipeline.store.partition_gates import partition_distillations, record_partition_gate

DISTILLATION_QUALITY_CHECK = "distillation_quality"


@dg.asset_check(asset=distillations, name=DISTILLATION_QUALITY_CHECK, blocking=True, partitions_def=users_partitions)
def distillation_quality(
    context: dg.AssetCheckExecutionContext, postgres: PostgresResource, embedder: EmbedderResource
) -> dg.AssetCheckResult:
    """Confidence in [0, 1]; tier in core/medium/low; 1–4 sentences; an embedding of the right
    size; no active row under the 0.6 gate. A failure stops this run's downstream steps, and the
    verdict is stored so later runs hold back conflict scoring and merges for that day too.

    A run over several days stores each day's verdict and passes when every day passes. Every
    expectation is about single rows, so the range's rows are validated together first (one
    validation, not one per day) and day by day only when that finds a failure.
    """
    dimensions = embedder.embedder().dimensions
    with postgres.database().connection() as conn:
        rows_by_day = {key: partition_distillations(conn, user_id=key[0], day=key[1])
                       for key in run_partitions(context, conn)}
        outcome = validate_distillations([row for rows in rows_by_day.values() for row in rows], dimensions=dimensions)
        failing: list[str] = []
        for (user_id, day), rows in rows_by_day.items():
            day_outcome = outcome if outcome.passed or len(rows_by_day) == 1 else validate_distillations(
                rows, dimensions=dimensions)
            record_partition_gate(conn, user_id=user_id, day=day, passed=day_outcome.passed,
                                  failures=day_outcome.failures)
            if not day_outcome.passed:
                failing.append(f"{day}|{user_id}")
    metadata: dict[str, int | str] = {"rows": outcome.rows, "failures": "; ".join(outcome.failures) or "none"}
    if len(rows_by_day) > 1:
        metadata["failing_days"] = ", ".join(failing) or "none"
    return dg.AssetCheckResult(passed=outcome.passed, severity=dg.AssetCheckSeverity.ERROR, metadata=metadata)
