"""Carrying a database over to another embedder: every vector made again by the active model.

Recall compares only vectors of the active embedding model (DESIGN §3), so after changing
``YAK_EMBEDDER`` (or its model) the memories are found by their words alone until their
vectors are made again. ``yak distill re-embed --all`` does that here:

1. when the new model's vectors have another size, every vector column is resized first
   (:func:`resize_for_embedder`, one transaction; the old vectors cannot be compared with the
   new ones anyway, and every text they came from is kept);
2. every live distillation is embedded again, then every exchange and its conversation context
   (:func:`reembed_database`), in batches that commit one by one: an interrupted run keeps what
   it did and the next run goes on from where it stopped;
3. ``yak_meta`` records the new model, and one audit row the whole operation.

The relevance model belongs to an embedder too (docs/RECALL.md): a model without a shipped fit
needs ``yak eval calibrate`` before recall answers; the command says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from yak_pipeline.embeddings import Embedder
from yak_pipeline.services.exchange_embeddings import embed_in_batches, embed_pending_contexts, embed_pending_exchanges
from yak_pipeline.store.audit import write_audit
from yak_pipeline.store.database import Database, connect
from yak_pipeline.store.migrations import read_meta
from yak_pipeline.store.reembed import (
    change_embedding_dimension,
    distillations_to_reembed,
    set_active_embedding_model,
    set_distillation_embeddings,
    validate_vector_checks,
)

# What is being embedded ("distillations", "exchanges", "contexts") and how many so far.
Progress = Callable[[str, int], None]


@dataclass
class ReembedReport:
    """What a re-embed did: the columns resized (if the size changed) and the rows embedded per kind."""

    embedding_model: str
    resized: list[str] = field(default_factory=list)
    distillations: int = 0
    exchanges: int = 0
    contexts: int = 0


def resize_for_embedder(url: str, embedder: Embedder) -> list[str]:
    """Resize every vector column to the embedder's size when the database holds another; the columns changed.

    Nothing happens (and nothing is returned) when the sizes already agree or the database is new.
    """
    with connect(url, vector=False) as conn:
        stored = read_meta(conn).get("embedding_dim")
        if stored is None or int(stored) == embedder.dimensions:
            return []
        with conn.transaction():
            return change_embedding_dimension(conn, dimensions=embedder.dimensions, model_name=embedder.model_name)


def reembed_database(db: Database, embedder: Embedder, *, batch_size: int = 128, actor: str = "cli",
                     on_progress: Progress | None = None, resized: list[str] | None = None) -> ReembedReport:
    """Embed every live distillation, exchange and exchange context with ``embedder`` (module docstring)."""
    report = ReembedReport(embedding_model=embedder.model_name, resized=list(resized or []))

    def tell(kind: str, count: int) -> None:
        if on_progress is not None:
            on_progress(kind, count)

    model = embedder.model_name
    report.distillations = embed_in_batches(
        db, embedder, batch_size=batch_size, on_progress=lambda n: tell("distillations", n),
        pending=lambda conn, n: distillations_to_reembed(conn, embedding_model=model, limit=n),
        store=lambda conn, vectors: set_distillation_embeddings(conn, embedding_model=model, vectors=vectors))
    report.exchanges = embed_pending_exchanges(db, embedder, batch_size=batch_size, contexts=False,
                                               on_progress=lambda n: tell("exchanges", n))
    report.contexts = embed_pending_contexts(db, embedder, batch_size=batch_size,
                                             on_progress=lambda n: tell("contexts", n))
    with db.connection() as conn:
        # Every active distillation has its vector again: the resize's relaxed checks hold again.
        validate_vector_checks(conn)
        set_active_embedding_model(conn, embedder.model_name)
        write_audit(conn, actor=actor, action="reembed_all", target_type="database", target_id=None, user_id=None,
                    detail={"embedding_model": embedder.model_name, "resized": report.resized,
                            "distillations": report.distillations, "exchanges": report.exchanges,
                            "contexts": report.contexts})
    return report
