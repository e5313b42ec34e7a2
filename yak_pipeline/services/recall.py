"""Recall for a query: embed it, run the store's recall, attach the memories' text.

With ``YAK_HYBRID_RECALL`` on (the default) recall is hybrid (``store.hybrid``): full text and
vectors over distillations and their raw exchanges, fused by reciprocal rank, then the DESIGN §4
score; off, it is the vector-only recall of ``store.recall``. Either way what comes back is the
user's active distillations, best first. Exchange vectors are filled by
:func:`embed_pending_exchanges` (recall itself never writes); until an exchange has one, it is a
full-text candidate only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from yak_pipeline.core.memory_block import BlockMemory, PromptBuild, build_prompt_messages
from yak_pipeline.embeddings import Embedder
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database, connect
from yak_pipeline.store.hybrid import (
    HybridParams,
    exchanges_without_embedding,
    hybrid_recall,
    set_exchange_embeddings,
)
from yak_pipeline.store.recall import USER_INDEX_MIN_ROWS, RecallParams, ensure_user_indexes, recall


@dataclass(frozen=True)
class RecallHit:
    """One recalled distillation, with its score and what it says."""

    id: str
    memory_id: str
    content: str
    confidence: float
    tier: str
    warmth: float
    similarity: float
    score: float

    @property
    def is_core(self) -> bool:
        """Core memories get the wider gate and double gravity."""
        return self.tier == "core"


def configured_hybrid_params(settings: Settings) -> HybridParams:
    """The ``YAK_HYBRID_*`` fusion knobs, whether or not hybrid recall is switched on."""
    return HybridParams(rrf_k=settings.hybrid_rrf_k, relevance_exponent=settings.hybrid_relevance_exponent,
                        text_weight=settings.hybrid_text_weight, vector_weight=settings.hybrid_vector_weight,
                        exchange_weight=settings.hybrid_exchange_weight,
                        exchange_context=settings.hybrid_exchange_context)


def hybrid_params(settings: Settings) -> HybridParams | None:
    """The configured hybrid-recall knobs, or None when ``YAK_HYBRID_RECALL`` is off."""
    return configured_hybrid_params(settings) if settings.hybrid_recall else None


def recall_params(settings: Settings, *, threshold: float = 0.7, limit: int = 5) -> RecallParams:
    """Recall parameters: the request's threshold and limit, the configured scoring and search."""
    return RecallParams(threshold=threshold, limit=limit, half_life_days=settings.half_life_days,
                        decay_enabled=settings.decay_enabled, core_multiplier=settings.core_threshold_multiplier,
                        hybrid=hybrid_params(settings))


def search_memories(
    db: Database,
    embedder: Embedder,
    *,
    user_id: str,
    query: str,
    params: RecallParams,
    now: datetime | None = None,
) -> list[RecallHit]:
    """The user's best distillations for ``query``, best first (DESIGN §4)."""
    vector = embedder.embed_query(query)
    with db.connection() as conn:
        if params.hybrid is not None:
            ranked = [hit.as_scored_memory() for hit in hybrid_recall(
                conn, user_id=user_id, query=query, query_embedding=vector, embedding_model=embedder.model_name,
                params=params, hybrid=params.hybrid, now=now)]
        else:
            ranked = recall(conn, user_id=user_id, query_embedding=vector, embedding_model=embedder.model_name,
                            params=params, now=now)
        if not ranked:
            return []
        rows = conn.execute(
            "SELECT id, memory_id, content, confidence FROM distillations WHERE id = ANY(%s::uuid[])",
            ([r.id for r in ranked],),
        ).fetchall()
    by_id = {str(r[0]): r for r in rows}
    return [
        RecallHit(id=r.id, memory_id=str(by_id[r.id][1]), content=by_id[r.id][2], confidence=by_id[r.id][3],
                  tier=r.tier, warmth=r.warmth, similarity=r.similarity, score=r.score)
        for r in ranked if r.id in by_id
    ]


def build_context(
    db: Database,
    embedder: Embedder,
    *,
    user_id: str,
    query: str,
    params: RecallParams,
    system_prompt: str = "",
    now: datetime | None = None,
) -> tuple[str, PromptBuild]:
    """The memory block for ``query`` and the prompt messages around it; recall failures degrade.

    If recall fails (database down, embedder broken) the prompt is still built, without memories,
    and ``PromptBuild.recall_error`` says why.
    """
    def _recall() -> list[BlockMemory]:
        hits = search_memories(db, embedder, user_id=user_id, query=query, params=params, now=now)
        return [BlockMemory(id=h.id, content=h.content, tier=h.tier) for h in hits]

    built = build_prompt_messages(system_prompt, query, _recall)
    block = next((m["content"] for m in built.messages[1:-1]), "")
    return block, built


def embed_pending_exchanges(
    db: Database,
    embedder: Embedder,
    *,
    user_id: str | None = None,
    batch_size: int = 128,
    on_progress: Callable[[int], None] | None = None,
) -> int:
    """Give every live exchange (of ``user_id``, or everyone) a vector of the active model.

    Batches commit one by one, so an interrupted run keeps what it did and the next run goes
    on from there. ``on_progress`` gets the running count after each batch. Returns how many
    exchanges were embedded.
    """
    done = 0
    while True:
        with db.connection() as conn:
            batch = exchanges_without_embedding(conn, embedding_model=embedder.model_name, user_id=user_id,
                                                limit=batch_size)
            if not batch:
                return done
            vectors = embedder.embed_documents([content for _, content in batch])
            done += set_exchange_embeddings(conn, embedding_model=embedder.model_name,
                                            vectors={memory_id: v for (memory_id, _), v in zip(batch, vectors)})
        if on_progress is not None:
            on_progress(done)


def maintain_recall_indexes(db: Database, *, min_rows: int = USER_INDEX_MIN_ROWS) -> list[str]:
    """Give every heavy user their own HNSW index (``store.recall.ensure_user_indexes``); the names built.

    Meant for a periodic maintenance run (after ingestion batches): recall stays exact without
    it, only slower for users with many thousands of rows. Indexes are built ``CONCURRENTLY``,
    so ingestion and recall go on meanwhile; that needs a connection outside the pool's
    transactions.
    """
    with connect(db.url, autocommit=True) as conn:
        return ensure_user_indexes(conn, min_rows=min_rows)
