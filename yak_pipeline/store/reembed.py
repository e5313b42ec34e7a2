"""Re-embedding a distillation: same text, a vector from the active embedding model.

The text does not change, so no version is written; the latest version's vector is replaced
too, so restoring that version later brings back a vector of the current model.
"""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

import numpy as np
import psycopg

from yak_pipeline.store.audit import write_audit


def replace_embedding(
    conn: psycopg.Connection,
    distillation_id: UUID | str,
    *,
    embedding: Sequence[float],
    embedding_model: str,
    user_id: str | None = None,
    actor: str = "system",
) -> bool:
    """Store a new vector for a live distillation (and its latest version); False when not found."""
    vector = np.asarray(embedding, dtype=np.float32)
    row = conn.execute(
        """UPDATE distillations SET embedding = %(v)s, embedding_model = %(model)s, updated_at = now()
           WHERE id = %(id)s AND deleted_at IS NULL AND (%(user)s::text IS NULL OR user_id = %(user)s)
           RETURNING user_id""",
        {"v": vector, "model": embedding_model, "id": str(distillation_id), "user": user_id},
    ).fetchone()
    if row is None:
        return False
    conn.execute(
        """UPDATE distillation_versions SET embedding = %(v)s, embedding_model = %(model)s
           WHERE id = (SELECT id FROM distillation_versions WHERE distillation_id = %(id)s AND deleted_at IS NULL
                       ORDER BY version DESC LIMIT 1)""",
        {"v": vector, "model": embedding_model, "id": str(distillation_id)},
    )
    write_audit(conn, actor=actor, action="reembed", target_type="distillation", target_id=distillation_id,
                user_id=row[0], detail={"embedding_model": embedding_model})
    return True
