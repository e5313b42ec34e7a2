"""The exchanges' vectors: which live exchanges lack one of the active model, and the writer storing them.

An exchange has two (sql/008): its own text's (``embedding``) and its text read with its
neighbours in the conversation (``context_embedding``). Recall never writes them;
``services.exchange_embeddings`` fills them in batches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import psycopg

from yak_pipeline.store.rows import uuid_array


def exchanges_without_embedding(conn: psycopg.Connection, *, embedding_model: str, user_id: str | None = None,
                                limit: int = 256, context: bool = False,
                                ids: Sequence[str] | None = None) -> list[tuple[str, str]]:
    """Up to ``limit`` live exchanges with no vector of ``embedding_model``: (id, text to embed), locked.

    ``ids``: only these exchanges (a write that has just stored them embeds them at once).
    With ``context``, the vector of the exchange read with its neighbours (sql/008), whose text
    is the exchange between its neighbours (``yak_exchange_context_text``). ``FOR UPDATE SKIP
    LOCKED`` lets several workers fill vectors at once without doing the same row twice.
    """
    column, text = ("context_embedding", "yak_exchange_context_text(id)") if context else ("embedding", "content")
    rows = conn.execute(
        f"""SELECT id, {text} FROM memories
            WHERE deleted_at IS NULL AND (%(user)s::text IS NULL OR user_id = %(user)s)
              AND (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))
              AND ({column} IS NULL OR {column}_model IS DISTINCT FROM %(model)s)
            ORDER BY occurred_at, id
            LIMIT %(limit)s
            FOR UPDATE SKIP LOCKED""",  # noqa: S608 - fixed column names
        {"user": user_id, "model": embedding_model, "limit": limit, "ids": None if ids is None else uuid_array(ids)},
    ).fetchall()
    return [(str(r[0]), r[1]) for r in rows]


def set_exchange_embeddings(conn: psycopg.Connection, *, embedding_model: str,
                            vectors: Mapping[str, Sequence[float]], context: bool = False) -> int:
    """Store each exchange's vector (by memory id; with ``context``, its context vector) and the model; rows given."""
    if not vectors:
        return 0
    column = "context_embedding" if context else "embedding"
    with conn.cursor() as cur:
        cur.executemany(
            f"UPDATE memories SET {column} = %(vector)s, {column}_model = %(model)s WHERE id = %(id)s",  # noqa: S608 - fixed names
            [{"vector": np.asarray(v, dtype=np.float32), "model": embedding_model, "id": memory_id}
             for memory_id, v in vectors.items()],
        )
    return len(vectors)
