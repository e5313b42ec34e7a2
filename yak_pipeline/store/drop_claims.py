"""The lock that lets one process at a time claim drop-folder files.

A file's exchanges can fall on several (user, day) partitions, whose runs may start side by
side and each claim the file; under this lock the first stores the whole file and moves it, and
the others then find it gone instead of storing it again and quarantining its bad records twice.
"""

from __future__ import annotations

import psycopg

# pg_advisory_xact_lock key: "YAKD" (the migrations' lock is "YAK").
_DROP_CLAIM_LOCK_KEY = 0x59414B44


def lock_drop_claims(conn: psycopg.Connection) -> None:
    """Wait for, then hold until ``conn``'s transaction ends, the drop-folder claiming lock.

    A transaction lock: released at commit or rollback, and by the server when the holding
    process dies, so a killed claimer never blocks the next one.
    """
    conn.execute("SELECT pg_advisory_xact_lock(%(key)s)", {"key": _DROP_CLAIM_LOCK_KEY})
