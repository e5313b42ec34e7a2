"""That a write's secrets were replaced: an audit row and the redaction counter, never the secret."""

from __future__ import annotations

from collections.abc import Mapping

import psycopg

from yak_pipeline.store.audit import write_audit
from yak_pipeline.store.metrics import append_metric_events, counter_event

REDACTION_COUNTER = "yak_secrets_redacted_total"


def record_redaction(conn: psycopg.Connection, *, kinds: Mapping[str, int], actor: str, user_id: str | None,
                     target_type: str, target_id: object | None, action: str = "redact_secrets") -> None:
    """Record, in the caller's transaction, how many secrets of each kind a row's text lost.

    Only the kinds and counts are written: the audit log says a redaction happened, the secret
    itself is gone before this is called.
    """
    if not kinds:
        return
    write_audit(conn, actor=actor, action=action, target_type=target_type, target_id=target_id, user_id=user_id,
                detail={"secrets": dict(sorted(kinds.items()))})
    append_metric_events(conn, [counter_event(REDACTION_COUNTER, count, {"kind": kind}) for kind, count in kinds.items()])
