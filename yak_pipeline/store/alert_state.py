"""``alert_state``: the cross-process de-duplication window of each alert type (sql/002)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the alerter is imported by light entry points; psycopg comes with the connection
    import psycopg

# Claims the dedup window for a type; returns a row only if this caller may send.
_CLAIM_SQL = """
INSERT INTO alert_state (alert_type, last_sent_at) VALUES (%(type)s, now())
ON CONFLICT (alert_type) DO UPDATE SET last_sent_at = now(), suppressed = 0
    WHERE alert_state.last_sent_at <= now() - make_interval(secs => %(window)s)
RETURNING alert_type
"""
_SUPPRESS_SQL = "UPDATE alert_state SET suppressed = suppressed + 1 WHERE alert_type = %(type)s"


def claim_alert_window(conn: psycopg.Connection, alert_type: str, *, window_seconds: float) -> bool:
    """Whether this caller may send an ``alert_type`` alert now; if so a new window starts.

    When another process sent one within ``window_seconds``, the type's suppressed count goes up
    instead. The caller commits.
    """
    row = conn.execute(_CLAIM_SQL, {"type": alert_type, "window": window_seconds}).fetchone()
    if row is None:
        conn.execute(_SUPPRESS_SQL, {"type": alert_type})
    return row is not None
