"""The raw layer as a Dagster asset."""

import dagster as dg

from yak_pipeline.defs.partitions import exchange_partitions, partition_parts
from yak_pipeline.defs.resources import PostgresResource
from yak_pipeline.store.memories import partition_memory_stats


@dg.asset(partitions_def=exchange_partitions, group_name="memory", kinds={"postgres"})
def raw_exchanges(context: dg.AssetExecutionContext, postgres: PostgresResource) -> dg.MaterializeResult:
    """Every exchange of one user's day, at full fidelity ("User: …\\nAssistant: …").

    Drop-folder files are parsed and stored when the sensor (or ``yak process``) claims them,
    and API posts are stored when they arrive, both idempotent on the content hash; this asset
    records and validates the partition's raw layer: rows by status and source, and any row
    whose stored hash no longer matches its text.
    """
    user_id, day = partition_parts(context.partition_key)
    with postgres.database().connection() as conn:
        stats = partition_memory_stats(conn, user_id=user_id, day=day)
    if stats["hash_mismatches"]:
        context.log.error("%s exchanges of %s on %s fail their hash check", stats["hash_mismatches"], user_id, day)
    return dg.MaterializeResult(metadata={"rows_in": stats["rows"], "rows_out": stats["rows"],
                                          "flagged": stats["hash_mismatches"], **stats})
