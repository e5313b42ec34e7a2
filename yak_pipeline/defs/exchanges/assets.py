"""The raw layer as a Dagster asset."""

import json

import dagster as dg

from yak_pipeline.defs.partitions import run_partitions, users_partitions
from yak_pipeline.defs.resources import PostgresResource
from yak_pipeline.ingestion.claim import ClaimReport, claim_drop_files
from yak_pipeline.store.memories import partition_memory_stats

# The run tag naming (as a JSON list) the drop-folder files a run's raw_exchanges stores; set by
# the drop-folder sensor and `yak process` for each user whose exchanges the files hold.
DROP_FILES_TAG = "yak/drop_files"


def _drop_files(context: dg.AssetExecutionContext) -> list[str]:
    """The file names of the run's :data:`DROP_FILES_TAG` (none for a run without it)."""
    raw = context.run.tags.get(DROP_FILES_TAG)
    try:
        names = json.loads(raw) if raw else []
    except ValueError:
        names = None
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        context.log.error("run tag %s is not a JSON list of file names: %r; no file claimed", DROP_FILES_TAG, raw)
        return []
    return names


@dg.asset(partitions_def=users_partitions, group_name="memory", kinds={"postgres"})
def raw_exchanges(context: dg.AssetExecutionContext, postgres: PostgresResource) -> dg.MaterializeResult:
    """Every exchange of one user's days (those the run's tags name, ``defs.partitions``), at full fidelity
    ("User: …\\nAssistant: …").

    Stores the drop-folder files the run was requested for (the ``yak/drop_files`` tag, set by
    the drop-folder sensor and ``yak process``): each file whole, idempotent on the content hash,
    then moved to ``processed/`` (bad records and unreadable files to ``failed/`` with their
    reasons). A file holding several users' exchanges is stored by the first of their runs; the
    others find it gone and their rows stored. API posts are stored when they arrive. Then records and
    validates the raw layer of the run's days: rows by status and source, and any row whose stored hash
    no longer matches its text.
    """
    db = postgres.database()
    names = _drop_files(context)
    claimed = claim_drop_files(db, postgres.settings().resolved_drop_dir, names=names) if names else ClaimReport()
    claimed.log_to(context.log)
    stats: dict[str, int] = {}
    with db.connection() as conn:
        covered = run_partitions(context, conn)
        for user_id, day in covered:
            day_stats = partition_memory_stats(conn, user_id=user_id, day=day)
            if day_stats["hash_mismatches"]:
                context.log.error("%s exchanges of %s on %s fail their hash check", day_stats["hash_mismatches"],
                                  user_id, day)
            for name, count in day_stats.items():
                stats[name] = stats.get(name, 0) + count
    return dg.MaterializeResult(metadata={
        "rows_in": stats.get("rows", 0), "rows_out": stats.get("rows", 0),
        "flagged": stats.get("hash_mismatches", 0), **stats,
        # The partition is the user; which of their days this run covered shows here (as a span:
        # an imported history has thousands of days).
        "days": len({day for _, day in covered}),
        "day_span": f"{min(day for _, day in covered)} … {max(day for _, day in covered)}" if covered else "none",
        "drop_files_claimed": len(claimed.files),
        "drop_files": dg.MetadataValue.json([vars(outcome) for outcome in claimed.files]),
    })
