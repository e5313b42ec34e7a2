"""Recall's upkeep: BM25's statistics folded and every heavy user's own HNSW indexes built."""

from __future__ import annotations

import logging
from collections.abc import Callable

from yak_pipeline.store.bm25 import fold_bm25_statistics
from yak_pipeline.store.database import Database, connect
from yak_pipeline.store.user_indexes import USER_INDEX_MIN_ROWS, ensure_user_indexes

# The shells word their progress with it and call services, not the store.
from yak_pipeline.store.user_indexes import describe_build as describe_build  # noqa: F401 - re-exported

logger = logging.getLogger("yak.recall")


def maintain_recall_indexes(db: Database, *, min_rows: int = USER_INDEX_MIN_ROWS,
                            on_build: Callable[[str, str, str, int], None] | None = None) -> list[str]:
    """Fold BM25's statistics (``store.bm25.fold_bm25_statistics``) and give every heavy user their
    own HNSW indexes (``store.user_indexes``); the names of the indexes built.

    Recall is the same without either, only slower for users with many thousands of rows
    (docs/BENCHMARKS.md): the nightly ``recall_index_job``, ``yak db index`` and the end of
    ``yak process`` run this; :func:`describe_build` words ``on_build``'s progress line. The
    builds are ``CONCURRENTLY`` (ingestion and recall go on meanwhile), which needs a connection
    outside the pool's transactions.
    """
    with connect(db.url, autocommit=True) as conn:
        folded = fold_bm25_statistics(conn)
        logger.info("folded BM25 statistics: %d delta rows fewer", folded)
        return ensure_user_indexes(conn, min_rows=min_rows, on_build=on_build)
