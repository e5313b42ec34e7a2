"""What every leg of recall shares: the rows a leg may read of each table, and the hit it returns.

The legs themselves are ``store.bm25`` (the text legs) and ``store.vector_legs`` (the cosine
legs); ``store.recall`` runs them and turns their hits into candidates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# ``as_of`` (recall as of a date) keeps only what had happened by then: an exchange by when it
# occurred, a distillation by its source exchange's time.
LEG_WHERE: Final[dict[str, str]] = {
    # Recall candidates are active distillations of the active embedding model (DESIGN §4).
    "distillations": "t.user_id = %(user)s AND t.status = 'active' AND t.deleted_at IS NULL "
                     "AND t.embedding_model = %(model)s AND (%(as_of)s::timestamptz IS NULL OR EXISTS ("
                     "SELECT 1 FROM memories m WHERE m.id = t.memory_id AND m.occurred_at <= %(as_of)s))",
    # Every live exchange of the user; its distillation is checked when it is mapped.
    "memories": "t.user_id = %(user)s AND t.deleted_at IS NULL "
                "AND (%(as_of)s::timestamptz IS NULL OR t.occurred_at <= %(as_of)s)",
}


@dataclass(frozen=True)
class LegHit:
    """One row of one leg: its id and the leg's own score (BM25 or cosine similarity)."""

    id: str
    score: float
