"""The columns that hold what people said, read and rewritten by ``yak db scan-secrets``.

``USER_TEXT_COLUMNS`` lists every text column a person's words reach; ``OTHER_TEXT_COLUMNS``
every other text column of Yak's schema, with why it holds none. A test compares both with the
live schema, so a column added later must be placed in one of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, NamedTuple

import numpy as np
import psycopg
from psycopg import sql

from yak_pipeline.core.exchanges import content_sha256
from yak_pipeline.store.rows import one_value, tuple_row_of

# (table, column): the text a person wrote or said, or that was made from it.
USER_TEXT_COLUMNS: Final[tuple[tuple[str, str], ...]] = (
    ("memories", "content"),
    ("memories", "source_ref"),        # a file name or an export's conversation title
    ("memories", "last_error"),        # an LLM's error may quote the exchange
    ("turns", "user_message"),
    ("turns", "assistant_message"),
    ("turns", "last_error"),
    ("distillations", "content"),
    ("distillation_versions", "content"),
    ("conflicts", "resolution"),
    ("profile_lines", "content"),      # a sentence of the user's side of an exchange (store.profile)
)
# Every other text column, and why it holds no one's words: names, hashes, states, metrics.
OTHER_TEXT_COLUMNS: Final[frozenset[tuple[str, str]]] = frozenset({
    *((t, "user_id") for t in ("memories", "turns", "distillations", "conflicts", "warmth_events", "audit_log",
                               "api_keys", "forget_confirmations", "partition_gates", "import_cursors",
                               "bm25_postings", "bm25_statistics", "profile_lines")),
    ("profile_lines", "kind"), ("profile_lines", "status"),
    ("memories", "source"), ("memories", "content_sha256"), ("memories", "status"), ("memories", "embedding_model"),
    ("memories", "context_embedding_model"),
    ("distillations", "tier"), ("distillations", "status"), ("distillations", "embedding_model"),
    ("distillations", "prompt_version"), ("distillations", "memory_type"),
    ("distillation_versions", "embedding_model"), ("distillation_versions", "prompt_version"),
    ("distillation_versions", "reason"),
    ("conflicts", "status"), ("turns", "status"),
    ("warmth_events", "reason"), ("warmth_events", "evaluator"),
    # ids and counts only (store/audit.py); a redaction is recorded by kind, never its value
    ("audit_log", "actor"), ("audit_log", "action"), ("audit_log", "target_type"), ("audit_log", "target_id"),
    ("api_keys", "key_hash"), ("api_keys", "prefix"), ("api_keys", "label"),
    ("forget_confirmations", "token_hash"),
    ("alert_state", "alert_type"),
    ("metric_events", "kind"), ("metric_events", "name"), ("metric_counters", "name"),
    ("metric_histogram_buckets", "name"),
    ("yak_meta", "key"), ("yak_meta", "value"), ("schema_migrations", "name"),
    ("import_cursors", "source_key"), ("import_cursors", "prefix_sha256"),
    # BM25's terms are kept by triggers from the text columns above: rewriting those rewrites them
    *((t, c) for t in ("bm25_postings", "bm25_statistics") for c in ("leg", "scope", "lexeme")),
})


def schema_text_columns(conn: psycopg.Connection) -> set[tuple[str, str]]:
    """Every ``(table, column)`` of type text or varchar in Yak's schema (views and restore scratch left out)."""
    rows = conn.execute(
        """SELECT c.table_name, c.column_name FROM information_schema.columns c
           JOIN information_schema.tables t USING (table_schema, table_name)
           WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'
             AND c.data_type IN ('text', 'character varying') AND c.table_name NOT LIKE 'yak_restore%%'"""
    ).fetchall()
    return {(r[0], r[1]) for r in rows}


class TextRow(NamedTuple):
    """A row's id and the text of the column being scanned."""

    id: str
    text: str


def text_batch(conn: psycopg.Connection, table: str, column: str, *, after: str | None,
               limit: int) -> list[TextRow]:
    """Up to ``limit`` rows of ``table`` with a non-empty ``column``, by id after ``after``."""
    query = sql.SQL("SELECT id::text AS id, {col} AS text FROM {tbl} WHERE {col} IS NOT NULL AND {col} <> '' "
                    "AND (%(after)s::text IS NULL OR id::text > %(after)s) ORDER BY id::text LIMIT %(limit)s").format(
        col=sql.Identifier(column), tbl=sql.Identifier(table))
    with conn.cursor(row_factory=tuple_row_of(TextRow)) as cur:
        return cur.execute(query, {"after": after, "limit": limit}).fetchall()


def count_rows(conn: psycopg.Connection, table: str, column: str) -> int:
    """How many rows of ``table`` have a non-empty ``column`` (the progress total)."""
    query = sql.SQL("SELECT count(*) FROM {tbl} WHERE {col} IS NOT NULL AND {col} <> ''").format(
        col=sql.Identifier(column), tbl=sql.Identifier(table))
    return one_value(conn, query, None, int)


def rewrite_text(conn: psycopg.Connection, table: str, column: str, row_id: str, text: str,
                 *, embedding: Sequence[float] | None = None) -> None:
    """Replace one row's text (its secrets redacted), keeping what depends on it consistent.

    An exchange's content gets its new hash and loses its vectors (the exchange-context trigger
    clears its neighbours' context vectors), so they are made again from the redacted text; a
    distillation's or version's content gets ``embedding``, the vector of the new text.
    """
    if (table, column) == ("memories", "content"):
        with conn.transaction():
            try:
                with conn.transaction():
                    conn.execute(
                        """UPDATE memories SET content = %(text)s, content_sha256 = %(content_sha256)s, embedding = NULL,
                                  embedding_model = NULL, context_embedding = NULL, context_embedding_model = NULL
                           WHERE id = %(row_id)s""", {"text": text, "content_sha256": content_sha256(text), "row_id": row_id})
            except psycopg.errors.UniqueViolation:
                # The redacted text equals another exchange of the same user: keep the old hash
                # (a key for re-ingesting, not text) rather than refuse to remove the secret.
                conn.execute(
                    """UPDATE memories SET content = %(text)s, embedding = NULL, embedding_model = NULL,
                              context_embedding = NULL, context_embedding_model = NULL WHERE id = %(row_id)s""",
                    {"text": text, "row_id": row_id})
        return
    if (table, column) in (("distillations", "content"), ("distillation_versions", "content")) and embedding is not None:
        query = sql.SQL("UPDATE {tbl} SET content = %(text)s, embedding = %(embedding)s WHERE id = %(row_id)s").format(
            tbl=sql.Identifier(table))
        conn.execute(query, {"text": text, "embedding": np.asarray(embedding, dtype=np.float32), "row_id": row_id})
        return
    query = sql.SQL("UPDATE {tbl} SET {col} = %(text)s WHERE id = %(row_id)s").format(
        tbl=sql.Identifier(table), col=sql.Identifier(column))
    conn.execute(query, {"text": text, "row_id": row_id})


def row_user(conn: psycopg.Connection, table: str, row_id: str) -> str | None:
    """The user a row belongs to (a version's: its distillation's), for the audit row."""
    if table == "distillation_versions":
        row = conn.execute("SELECT d.user_id FROM distillation_versions v JOIN distillations d ON d.id = v.distillation_id "
                           "WHERE v.id = %(row_id)s", {"row_id": row_id}).fetchone()
    else:
        row = conn.execute(sql.SQL("SELECT user_id FROM {tbl} WHERE id = %(row_id)s").format(tbl=sql.Identifier(table)),
                           {"row_id": row_id}).fetchone()
    return None if row is None else row[0]
