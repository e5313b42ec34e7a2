"""``yak db scan-secrets``: find the secrets an existing database already holds, and redact them.

Writes have screened their text since issue 35 (core/secrets.py); what was stored before is
read here, column by column (store/secret_scan.py lists every column people's words reach),
in batches that commit one by one, so an interrupted scan keeps what it did and the next one
finds the rest. A changed exchange loses its vectors and is embedded again from the redacted
text; a changed distillation or version gets the vector of its new text in the same commit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from yak_pipeline.core.secrets import redact_secrets
from yak_pipeline.embeddings import Embedder
from yak_pipeline.services.exchange_embeddings import embed_pending_exchanges
from yak_pipeline.store.database import Database
from yak_pipeline.store.secret_redactions import record_redaction
from yak_pipeline.store.secret_scan import USER_TEXT_COLUMNS, count_rows, rewrite_text, row_user, text_batch

# (table.column, rows read so far, rows in the column)
ScanProgress = Callable[[str, int, int], None]
_EMBEDDED = {("distillations", "content"), ("distillation_versions", "content")}


@dataclass
class SecretScanReport:
    """What a scan read and found: rows per column, rows with secrets, secrets by kind."""

    dry_run: bool
    rows_read: dict[str, int] = field(default_factory=dict)
    rows_with_secrets: dict[str, int] = field(default_factory=dict)
    secrets: Counter[str] = field(default_factory=Counter)
    exchanges_reembedded: int = 0

    def as_dict(self) -> dict[str, object]:
        """The report as JSON-ready data (``--json``)."""
        return {"dry_run": self.dry_run, "rows_read": self.rows_read, "rows_with_secrets": self.rows_with_secrets,
                "secrets": dict(sorted(self.secrets.items())), "secrets_total": sum(self.secrets.values()),
                "exchanges_reembedded": self.exchanges_reembedded}


def scan_secrets(db: Database, embedder: Embedder | None, *, dry_run: bool = False, batch_size: int = 500,
                 actor: str = "cli", on_progress: ScanProgress | None = None) -> SecretScanReport:
    """Find (and unless ``dry_run``, redact) every secret in the database's user text; the report.

    ``embedder`` makes the new vectors of changed rows; it is needed unless ``dry_run``.
    """
    if embedder is None and not dry_run:
        raise ValueError("redacting needs the embedder, to make the changed rows' vectors again")
    report = SecretScanReport(dry_run=dry_run)
    for table, column in USER_TEXT_COLUMNS:
        name = f"{table}.{column}"
        with db.connection() as conn:
            total = count_rows(conn, table, column)
        read = changed = 0
        after: str | None = None
        while True:
            with db.connection() as conn:
                batch = text_batch(conn, table, column, after=after, limit=batch_size)
                if not batch:
                    break
                after = batch[-1].id
                found = [(row_id, redact_secrets(text)) for row_id, text in batch]
                found = [(row_id, r) for row_id, r in found if r.count]
                vectors = (embedder.embed_documents([r.text for _, r in found])
                           if found and not dry_run and (table, column) in _EMBEDDED and embedder is not None
                           else [None] * len(found))
                for (row_id, redaction), vector in zip(found, vectors, strict=True):
                    report.secrets.update(redaction.kinds)
                    if dry_run:
                        continue
                    rewrite_text(conn, table, column, row_id, redaction.text, embedding=vector)
                    record_redaction(conn, kinds=redaction.kinds, actor=actor, user_id=row_user(conn, table, row_id),
                                     target_type=table, target_id=row_id)
                read += len(batch)
                changed += len(found)
            if on_progress is not None:
                on_progress(name, read, total)
        report.rows_read[name] = read
        report.rows_with_secrets[name] = changed
    if not dry_run and report.rows_with_secrets.get("memories.content") and embedder is not None:
        report.exchanges_reembedded = embed_pending_exchanges(db, embedder)
    return report
