"""The exchanges' vectors, of each exchange alone and read with its neighbours (sql/008), made in batches.

Recall itself never writes: until an exchange has its vectors, it is found by its words and its
distillation's vector only. The pipeline fills them (:func:`embed_pending_exchanges`,
:func:`embed_pending_contexts`), and a single write right after it (:func:`embed_exchanges_now`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import psycopg

from yak_pipeline.embeddings import Embedder
from yak_pipeline.store.database import Database
from yak_pipeline.store.exchange_vectors import exchanges_without_embedding, set_exchange_embeddings

logger = logging.getLogger("yak.recall")


def embed_in_batches(
    db: Database,
    embedder: Embedder,
    *,
    pending: Callable[[psycopg.Connection, int], list[tuple[str, str]]],
    store: Callable[[psycopg.Connection, dict[str, list[float]]], int],
    batch_size: int = 128,
    on_progress: Callable[[int], None] | None = None,
) -> int:
    """Embed the ``(id, text)`` rows ``pending`` locks for a batch and ``store`` their vectors, until none are left.

    Batches commit one by one, so an interrupted run keeps what it did and the next run goes
    on from there. ``on_progress`` gets the running count after each batch. Returns the count.
    """
    done = 0
    while True:
        with db.connection() as conn:
            batch = pending(conn, batch_size)
            if not batch:
                return done
            vectors = embedder.embed_documents([text for _, text in batch])
            done += store(conn, {row_id: v for (row_id, _), v in zip(batch, vectors)})
        if on_progress is not None:
            on_progress(done)


def embed_pending_exchanges(
    db: Database,
    embedder: Embedder,
    *,
    user_id: str | None = None,
    batch_size: int = 128,
    on_progress: Callable[[int], None] | None = None,
    contexts: bool = True,
) -> int:
    """Give every live exchange (of ``user_id``, or everyone) a vector of the active model, then
    (with ``contexts``) its context one (:func:`embed_pending_contexts`).

    Batches commit one by one (:func:`embed_in_batches`). Returns how many exchanges got their
    own vector.
    """
    model = embedder.model_name
    done = embed_in_batches(
        db, embedder, batch_size=batch_size, on_progress=on_progress,
        pending=lambda conn, n: exchanges_without_embedding(conn, embedding_model=model, user_id=user_id, limit=n),
        store=lambda conn, vectors: set_exchange_embeddings(conn, embedding_model=model, vectors=vectors))
    if contexts:
        embed_pending_contexts(db, embedder, user_id=user_id, batch_size=batch_size)
    return done


def embed_exchanges_now(db: Database, embedder: Embedder, memory_ids: Sequence[str]) -> int:
    """Give just-written exchanges their vectors (their own and in context) now, so recall finds them
    by meaning at once, not only by their words; how many vectors were stored.

    For single writes (the API, MCP, the proxy's turns), in the request or right after it: a
    failing embedder only logs, the write stands and the pipeline embeds the exchange later
    (:func:`embed_pending_exchanges`). A neighbour whose context the new exchange changed waits
    for the pipeline too.
    """
    ids = [str(i) for i in memory_ids]
    if not ids:
        return 0
    done = 0
    try:
        for context in (False, True):
            done += _embed_these(db, embedder, ids, context=context)
    except Exception as exc:  # noqa: BLE001 - the write stands; the pipeline embeds it later
        logger.warning("could not embed %d new exchange(s) at once; the pipeline will: %s", len(ids),
                       " ".join(str(exc).split())[:200] or type(exc).__name__)
    return done


def embed_pending_contexts(db: Database, embedder: Embedder, *, user_id: str | None = None,
                           batch_size: int = 128, on_progress: Callable[[int], None] | None = None) -> int:
    """Give every live exchange whose context changed (sql/008) a vector of it read with its neighbours.

    A context changes when a neighbour arrives, moves or is forgotten, so this runs after every
    batch of new exchanges (the distillation stage calls it). Batches commit one by one
    (:func:`embed_in_batches`). Returns how many were embedded.
    """
    model = embedder.model_name
    return embed_in_batches(
        db, embedder, batch_size=batch_size, on_progress=on_progress,
        pending=lambda conn, n: exchanges_without_embedding(conn, embedding_model=model, user_id=user_id, limit=n,
                                                            context=True),
        store=lambda conn, vectors: set_exchange_embeddings(conn, embedding_model=model, vectors=vectors, context=True))


def _embed_these(db: Database, embedder: Embedder, ids: Sequence[str], *, context: bool) -> int:
    """Embed ``ids``' exchanges that lack the vector (their own, or with ``context`` their context one)."""
    model = embedder.model_name
    return embed_in_batches(
        db, embedder, batch_size=max(len(ids), 1),
        pending=lambda conn, n: exchanges_without_embedding(conn, embedding_model=model, limit=n, context=context,
                                                            ids=ids),
        store=lambda conn, vectors: set_exchange_embeddings(conn, embedding_model=model, vectors=vectors,
                                                            context=context))
