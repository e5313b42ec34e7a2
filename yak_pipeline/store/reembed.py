"""Re-embedding: same text, a vector from the active embedding model.

The text does not change, so no version is written; the latest version's vector is replaced
too, so restoring that version later brings back a vector of the current model.

Switching the embedder carries a whole database over (``services.reembed``): when the new
model's vectors have another size, :func:`change_embedding_dimension` gives every vector column
that size first (the old vectors are cleared: they cannot be compared with the new ones anyway),
then every distillation, exchange and exchange context is embedded again in batches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from uuid import UUID

import numpy as np
import psycopg
from psycopg import sql

from yak_pipeline.store.audit import write_audit
from yak_pipeline.store.rows import one_value

# pg_attribute.attstorage codes and their names in ALTER TABLE … SET STORAGE.
_STORAGE = {"p": "PLAIN", "e": "EXTERNAL", "m": "MAIN", "x": "EXTENDED"}


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


def distillations_to_reembed(conn: psycopg.Connection, *, embedding_model: str,
                             limit: int = 256) -> list[tuple[str, str]]:
    """Up to ``limit`` live distillations without a vector of ``embedding_model``: (id, content), locked.

    ``FOR UPDATE SKIP LOCKED`` lets several workers share the work without doing a row twice.
    """
    rows = conn.execute(
        """SELECT id, content FROM distillations
           WHERE deleted_at IS NULL AND (embedding IS NULL OR embedding_model IS DISTINCT FROM %(model)s)
           ORDER BY created_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED""",
        {"model": embedding_model, "limit": limit},
    ).fetchall()
    return [(str(r[0]), r[1]) for r in rows]


def set_distillation_embeddings(conn: psycopg.Connection, *, embedding_model: str,
                                vectors: Mapping[str, Sequence[float]]) -> int:
    """Store each distillation's new vector (and its latest version's), as :func:`replace_embedding`; rows given."""
    if not vectors:
        return 0
    args = [{"v": np.asarray(v, dtype=np.float32), "model": embedding_model, "id": i} for i, v in vectors.items()]
    with conn.cursor() as cur:
        cur.executemany("UPDATE distillations SET embedding = %(v)s, embedding_model = %(model)s, updated_at = now() "
                        "WHERE id = %(id)s", args)
        cur.executemany(
            """UPDATE distillation_versions SET embedding = %(v)s, embedding_model = %(model)s
               WHERE id = (SELECT id FROM distillation_versions WHERE distillation_id = %(id)s AND deleted_at IS NULL
                           ORDER BY version DESC LIMIT 1)""", args)
    return len(vectors)


def vector_columns(conn: psycopg.Connection) -> list[tuple[str, str]]:
    """Every (table, column) of type ``vector`` in the schema, in a stable order."""
    rows = conn.execute(
        """SELECT c.relname, a.attname FROM pg_attribute a
           JOIN pg_class c ON c.oid = a.attrelid JOIN pg_type t ON t.oid = a.atttypid
           WHERE t.typname = 'vector' AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
             AND c.relnamespace = current_schema()::regnamespace
           ORDER BY c.relname, a.attname""").fetchall()
    return [(r[0], r[1]) for r in rows]


def change_embedding_dimension(conn: psycopg.Connection, *, dimensions: int, model_name: str) -> list[str]:
    """Give every vector column ``dimensions`` (old vectors cleared) and record it in ``yak_meta``.

    Run in one transaction: the vector indexes (shared and per-user HNSW) are dropped, the
    columns retyped, the model columns beside them cleared, and the same indexes built again
    (on empty columns: quick). Checks that need a vector ("an active distillation has one")
    come back ``NOT VALID``: new and updated rows must meet them at once, the rows waiting for
    their new vector are let be until :func:`validate_vector_checks` (the end of the re-embed)
    proves every row meets them again. Returns the ``table.column`` names changed.
    """
    if dimensions < 1:
        raise ValueError(f"dimensions must be positive, got {dimensions}")
    columns = vector_columns(conn)
    tables = sorted({table for table, _ in columns})
    indexes = conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() AND tablename = ANY(%(tables)s) "
        "AND indexdef ILIKE '%%USING hnsw%%' ORDER BY indexname", {"tables": tables}).fetchall()
    for name, _ in indexes:
        conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(name)))
    checks = conn.execute(
        """SELECT c.conrelid::regclass::text, c.conname, pg_get_constraintdef(c.oid) FROM pg_constraint c
           WHERE c.contype = 'c' AND c.conrelid::regclass::text = ANY(%(tables)s) AND pg_get_constraintdef(c.oid) ~ 'embedding'
           ORDER BY 1, 2""", {"tables": tables}).fetchall()
    for table, name, _ in checks:
        conn.execute(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(sql.Identifier(table), sql.Identifier(name)))
    for table, column in columns:
        # A new type resets the column's storage to the type's default; keep what sql/012 chose.
        storage = one_value(conn, "SELECT attstorage FROM pg_attribute WHERE attrelid = %(table)s::regclass"
                            " AND attname = %(column)s", {"table": table, "column": column}, str)
        conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE vector({}) USING NULL").format(
            sql.Identifier(table), sql.Identifier(column), sql.Literal(int(dimensions))))
        conn.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET STORAGE {}").format(
            sql.Identifier(table), sql.Identifier(column), sql.SQL(_STORAGE[storage])))
        conn.execute(sql.SQL("UPDATE {} SET {} = NULL WHERE {} IS NOT NULL").format(
            sql.Identifier(table), sql.Identifier(f"{column}_model"), sql.Identifier(f"{column}_model")))
    for _, definition in indexes:
        conn.execute(definition)
    for table, name, definition in checks:
        conn.execute(sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {} NOT VALID").format(
            sql.Identifier(table), sql.Identifier(name), sql.SQL(definition)))
    conn.execute("UPDATE yak_meta SET value = %(dimensions)s WHERE key = 'embedding_dim'", {"dimensions": str(int(dimensions))})
    conn.execute("UPDATE yak_meta SET value = %(model_name)s WHERE key = 'embedding_model'", {"model_name": model_name})
    return [f"{table}.{column}" for table, column in columns]


def set_active_embedding_model(conn: psycopg.Connection, model_name: str) -> None:
    """Record in ``yak_meta`` which model the database's vectors now come from."""
    conn.execute("UPDATE yak_meta SET value = %(model_name)s WHERE key = 'embedding_model'", {"model_name": model_name})


def validate_vector_checks(conn: psycopg.Connection) -> list[str]:
    """Validate the checks :func:`change_embedding_dimension` left ``NOT VALID``; the names validated.

    Fails (and stays not valid) while some row still breaks one, e.g. an active distillation
    that has no vector yet.
    """
    rows = conn.execute(
        """SELECT c.conrelid::regclass::text, c.conname FROM pg_constraint c
           WHERE c.contype = 'c' AND NOT c.convalidated AND pg_get_constraintdef(c.oid) ~ 'embedding'
             AND c.connamespace = current_schema()::regnamespace ORDER BY 1, 2""").fetchall()
    for table, name in rows:
        conn.execute(sql.SQL("ALTER TABLE {} VALIDATE CONSTRAINT {}").format(sql.Identifier(table),
                                                                             sql.Identifier(name)))
    return [name for _, name in rows]
