"""Connections: which database is in use, and a psycopg 3 pool with pgvector registered."""

from __future__ import annotations

import re
import select
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from urllib.parse import urlsplit, urlunsplit

import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql
from psycopg_pool import ConnectionPool, PoolTimeout

from yak_pipeline.core.secrets import SecretsPolicy
from yak_pipeline.settings import Settings
from yak_pipeline.store.errors import DatabaseUnavailable, PgvectorMissing

CONNECT_TIMEOUT_SECONDS = 5
POOL_WAIT_SECONDS = 10
# How long idle_connection waits for a connection: long enough for a free one, not for one in use.
_IDLE_WAIT_SECONDS = 0.002


def redact_url(url: str) -> str:
    """The URL with any password replaced, safe for messages and logs."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def resolve_database_url(settings: Settings, *, start_embedded: bool = True) -> str:
    """``YAK_DATABASE_URL`` when set, else the embedded server's URL (starting it if needed)."""
    if settings.database_url:
        return settings.database_url
    from yak_pipeline.store.embedded import start_embedded_server

    if not start_embedded:
        raise DatabaseUnavailable("YAK_DATABASE_URL is unset and the embedded server was not started")
    return start_embedded_server(settings.pgdata_dir)


def with_database(url: str, dbname: str) -> str:
    """The same server URL pointing at another database (the Dagster, test and eval databases).

    A ``postgresql://`` URL stays a URL (SQLAlchemy, used by dagster-postgres, needs one);
    a ``key=value`` connection string stays one.
    """
    parts = urlsplit(url)
    if parts.scheme in ("postgres", "postgresql"):
        return urlunsplit((parts.scheme, parts.netloc, "/" + dbname, parts.query, parts.fragment))
    info = psycopg.conninfo.conninfo_to_dict(url)
    info["dbname"] = dbname
    return psycopg.conninfo.make_conninfo("", **info)


def dagster_storage_url(url: str) -> str:
    """The URL of Dagster's own storage: database ``dagster`` on Yak's server, for dagster-postgres.

    dagster-postgres speaks psycopg2 through SQLAlchemy, and SQLAlchemy 2.1 picks psycopg 3 for
    a bare ``postgresql://``, so the driver is named.
    """
    target = with_database(url, "dagster")
    return re.sub(r"^postgres(ql)?://", "postgresql+psycopg2://", target)


def ensure_dagster_database(url: str) -> bool:
    """Create the ``dagster`` database (Dagster's runs, events, schedules) if missing; True if created."""
    with connect(url, autocommit=True, vector=False) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = 'dagster'").fetchone() is not None:
            return False
        conn.execute("CREATE DATABASE dagster")
        return True


def create_database(server_url: str, name: str) -> None:
    """Create database ``name`` on the server of ``server_url`` (a psycopg error when not allowed)."""
    with connect(server_url, autocommit=True, vector=False) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def drop_database(server_url: str, name: str) -> None:
    """Drop database ``name`` if it exists, closing its open connections (``WITH (FORCE)``)."""
    with connect(server_url, autocommit=True, vector=False) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def connect(url: str, *, autocommit: bool = False, vector: bool = True) -> psycopg.Connection:
    """One connection, with a one-line :class:`DatabaseUnavailable` instead of a traceback."""
    try:
        conn = psycopg.connect(url, autocommit=autocommit, connect_timeout=CONNECT_TIMEOUT_SECONDS)
    except psycopg.OperationalError as exc:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        reason = lines[0] if lines else type(exc).__name__
        raise DatabaseUnavailable(
            f"cannot connect to {redact_url(url)}: {reason} "
            "(check YAK_DATABASE_URL, or unset it to use the embedded server)"
        ) from None
    if vector:
        _register_vector(conn)
    return conn


def _register_vector(conn: psycopg.Connection) -> None:
    try:
        register_vector(conn)
    except psycopg.ProgrammingError:
        conn.close()
        raise PgvectorMissing(
            "the vector type is not installed in this database: run `yak db migrate` "
            "(the server needs the pgvector extension)"
        ) from None
    # register_vector may leave a transaction open; the pool wants idle connections.
    if not conn.autocommit:
        conn.rollback()


@contextmanager
def _autocommit(conn: psycopg.Connection) -> Iterator[None]:
    """``conn`` in autocommit mode for the block, then back as the pool lends it (starting transactions).

    No BEGIN and no COMMIT: two round trips fewer per connection, which recall paid on each of the
    three it uses, the first before its first query. A connection that cannot be set back is
    closed, and the pool replaces it: it must never lend one that commits every statement.
    """
    conn.autocommit = True
    try:
        yield
    finally:
        try:
            conn.autocommit = False
        except psycopg.Error:
            conn.close()


def check_idle_connection(conn: psycopg.Connection) -> None:
    """The pool's check before it hands out a connection: raises when the connection is gone.

    A server that goes away (restart, ``pg_terminate_backend``, idle timeout) sends its reason
    and closes the socket, which makes the idle connection readable; an idle connection that is
    not readable has had nothing happen to it. So the round trip of psycopg_pool's own check
    (``ConnectionPool.check_connection``) is made only then: it cost a recall up to three
    sequential round trips before its first query (one per connection it uses), 0.2 ms each on
    a quiet machine and milliseconds on a busy one.
    """
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the connection is closed")
    readable = select.poll()
    readable.register(conn.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
    if readable.poll(0):
        ConnectionPool.check_connection(conn)


class Database:
    """A connection pool for one database URL; every store function takes a connection from it.

    ``secrets`` is what writes through this pool do with a secret in their text (``YAK_SECRETS``,
    core/secrets.py): the services hand it to the store's write functions.
    """

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 10, secrets: SecretsPolicy = "redact") -> None:
        self.url = url
        self.secrets: SecretsPolicy = secrets
        self._pool = ConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            kwargs={"connect_timeout": CONNECT_TIMEOUT_SECONDS},
            configure=_register_vector,
            # Connections killed by a server restart are noticed before they are handed out.
            check=check_idle_connection,
            # During an outage, callers (API requests) get DatabaseUnavailable within seconds
            # instead of waiting psycopg_pool's default 30 s.
            timeout=POOL_WAIT_SECONDS,
            open=False,
            name="yak",
        )

    def open(self, timeout: float = 10.0) -> Database:
        """Open the pool, failing with a one-line error when the server is unreachable."""
        try:
            self._pool.open(wait=True, timeout=timeout)
        except PoolTimeout:
            self._pool.close()
            # Reproduce the real reason with a direct connection attempt.
            connect(self.url, vector=False).close()
            raise DatabaseUnavailable(f"cannot open a connection pool to {redact_url(self.url)}") from None
        return self

    @property
    def max_connections(self) -> int:
        """The most connections the pool opens at once."""
        return self._pool.max_size

    def close(self) -> None:
        """Close every pooled connection."""
        self._pool.close()

    def __enter__(self) -> Database:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ping(self) -> None:
        """Run a trivial query on a pooled connection; raises when the database does not answer."""
        with self.connection() as conn:
            conn.execute("SELECT 1").fetchone()

    @contextmanager
    def connection(self, *, autocommit: bool = False) -> Iterator[psycopg.Connection]:
        """A pooled connection in a transaction: committed on success, rolled back on error.

        With ``autocommit`` each statement is its own transaction (:func:`_autocommit`), for reads
        that need no snapshot in common: recall, which reads on several connections at once anyway.
        """
        try:
            with self._pool.connection() as conn, _autocommit(conn) if autocommit else nullcontext():
                yield conn
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise DatabaseUnavailable(f"database connection lost: {str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}") from exc

    @contextmanager
    def idle_connection(self, *, autocommit: bool = False) -> Iterator[psycopg.Connection | None]:
        """One more pooled connection that is free now, or None when the pool is busy (``autocommit`` as
        in :meth:`connection`).

        For work that can use another connection but needs none (a thread running some of
        recall's legs): it never waits for a connection another caller will give back. It asks the
        pool with a very short timeout, which also lets a pool below its maximum open another
        connection for the next caller.
        """
        with ExitStack() as stack:
            try:
                conn = stack.enter_context(self._pool.connection(timeout=_IDLE_WAIT_SECONDS))
            except PoolTimeout:
                conn = None
            if conn is not None and autocommit:
                stack.enter_context(_autocommit(conn))
            yield conn
