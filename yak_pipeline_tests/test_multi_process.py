"""More than one process (issue 37 §4, docs/SCALING.md §2–3): two ``yak serve``, ``yak proxy`` and
Dagster's run queue on one separately started PostgreSQL, under 20 concurrent clients.

Every part is a real process on a real server:

- PostgreSQL 18 with pgvector started on its own (``external_postgres``: a TCP port, password
  auth, a non-superuser owner role), migrated by ``yak db migrate`` as docs/SCALING.md says;
- two ``yak serve`` and one ``yak proxy`` subprocesses with the same ``YAK_DATABASE_URL``; the
  proxy's upstream is the loopback OpenAI-protocol server (``yak_loopback.openai_server``);
- Dagster as ``yak up`` runs it, minus the web UI: ``yak up``'s own DAGSTER_HOME preparation (the
  project's ``dagster.yaml``: PostgreSQL storage in database ``dagster`` of the same server,
  ``QueuedRunCoordinator`` with ``max_concurrent_runs: 4``), its code server (run workers forked
  from a warm process) and ``dagster-daemon run``. The daemon's sensors see the clients' pending
  memories and turns and request runs per user; the run queue starts them, four at a time.

Twenty clients run for ``LOAD_SECONDS``: 16 on the HTTP API, each posting a new memory
(``POST /api/memories``) then recalling for its user (``POST /api/context``) ``RECALLS_PER_WRITE``
times, and 4 chatting through the proxy with their user's own key. The API clients' requests go to
one ``yak serve`` and to both (round robin) in turn, in 5 s windows, so that the two counts share
alike whatever else the machine does (Dagster's runs, other jobs). Then the API processes and the
proxy stop (the proxy stores the turns it answered as it stops) and the daemon drains the queue.

Checked: no request failed (every status as documented, no recall error, each chat answered as the
upstream answered it) and no process logged a traceback; every acknowledged write is in the
database exactly once and nothing else is (each chat's exchange once, one turn per chat); every
memory and turn was processed, with the pipeline's invariants (``pipeline_state``: one distillation
per memory, its versions and audit rows); every Dagster run succeeded; Dagster's runs are in that
server's ``dagster`` database; four runs were out of the queue at once and never more, four ran at
once, and the limit held runs back in the queue meanwhile (the runs' enqueue, dequeue, start and
end times). Recall's p50/p95 per number of API processes is printed as a table (to the terminal;
under pytest-xdist only the JSON line shows, with ``-rP``), and written to ``multi_process.json``
in the test's tmp dir and ``$RELIABILITY_FIGURES`` when set; docs/SCALING.md §2 cites it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import psycopg
import pytest

from yak_loopback.openai_replies import chat_replier
from yak_loopback.openai_server import FakeOpenAIServer
from yak_pipeline.settings import Settings
from yak_pipeline.store.api_keys import create_api_key
from yak_pipeline.store.database import Database
from yak_pipeline_tests.external_postgres import external_postgres
from yak_pipeline_tests.reliability_helpers import WORDS, pipeline_state, report_figure, yak_env, yak_serve

pytestmark = pytest.mark.slow

CLIENTS = 20
PROXY_CLIENTS = 4  # of the 20; the others use the HTTP API
USERS = 10
SEED_PER_USER = 8
LOAD_SECONDS = 30.0
WINDOW_SECONDS = 5.0  # one API process, then two, in turn
RECALLS_PER_WRITE = 4
CHAT_PAUSE_SECONDS = 0.5
DRAIN_SECONDS = 240.0
MAX_CONCURRENT_RUNS = 4  # the project's dagster.yaml
ADMIN_KEY = "multi-process-admin-key-0123456789"
UPSTREAM_KEY = "sk-upstream-multi-process"


def _user(n: int) -> str:
    return f"mp-{n % USERS}"


def _fact(tag: str, n: int) -> str:
    """A distinct exchange (``tag`` makes it unique), as a client would post it."""
    a, b = WORDS[n % len(WORDS)], WORDS[(n * 7 + 3) % len(WORDS)]
    return f"User: I keep {n} jars of {a} tea labelled {b} on shelf {tag}.\nAssistant: Noted."


# --- Dagster as `yak up` runs it, minus the web UI -------------------------------------------------


@dataclass
class Dagster:
    """``yak up``'s code server and daemon on a DAGSTER_HOME of their own."""

    home: Path
    env: dict[str, str]
    port: int
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start(self, name: str, command: list[str]) -> None:
        with (self.home / f"{name}.log").open("w") as log:
            self.processes[name] = subprocess.Popen(command, env=self.env, cwd=self.home, stdout=log,
                                                    stderr=subprocess.STDOUT, start_new_session=True)

    def start_daemon(self) -> None:
        """``dagster-daemon run`` once the code server answers (as ``yak up``: the daemon would
        retry an unreachable code location only every 60 s)."""
        from yak_pipeline.cli.dagster_runtime import DAEMON_LOG_LEVEL, wait_for_code_server

        wait_for_code_server(self.processes["code-server"], "127.0.0.1", self.port, timeout=240)
        self.start("dagster-daemon", [str(Path(sys.executable).parent / "dagster-daemon"), "run",
                                      "-w", str(self.home / "workspace.yaml"), "--log-level", DAEMON_LOG_LEVEL])

    def alive(self) -> bool:
        return all(p.poll() is None for p in self.processes.values())

    def logs(self) -> str:
        return "".join(f"--- {name}\n" + (self.home / f"{name}.log").read_text(errors="replace")
                       for name in self.processes)

    def instance(self):  # noqa: ANN201 - a DagsterInstance, imported lazily
        import dagster as dg

        return dg.DagsterInstance.from_config(str(self.home))


@contextmanager
def yak_dagster(settings: Settings, database_url: str) -> Iterator[Dagster]:
    """The DAGSTER_HOME ``yak up`` prepares (the project's dagster.yaml; Dagster's storage in database
    ``dagster`` of the same server) and its code server, started now; the daemon is started by
    :meth:`Dagster.start_daemon`. Stopped as ``yak up`` stops them: the daemon, then the code server
    (its run workers with it)."""
    from yak_pipeline.cli.dagster_runtime import CODE_LOCATION, prepare_dagster_home, write_workspace
    from yak_pipeline.ports import free_port

    env = prepare_dagster_home(settings, database_url)
    env.update(YAK_DATABASE_URL=database_url, YAK_EMBEDDER="hashing")
    home = Path(env["DAGSTER_HOME"])
    dagster = Dagster(home, env, free_port("127.0.0.1"))
    write_workspace(home, "127.0.0.1", dagster.port)
    assert CODE_LOCATION in (home / "workspace.yaml").read_text()
    try:
        dagster.start("code-server", [
            sys.executable, "-c", "import sys; from yak_pipeline.cli.dagster_runtime import serve_code_location; "
            "serve_code_location(sys.argv[1], int(sys.argv[2]))", "127.0.0.1", str(dagster.port)])
        yield dagster
    finally:
        for name in ("dagster-daemon", "code-server"):
            process = dagster.processes.get(name)
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(timeout=10)


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """The most spans open at one moment (an end at the very moment of a start does not overlap it)."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    open_now = most = 0
    for _, step in events:
        open_now += step
        most = max(most, open_now)
    return most


@dataclass(frozen=True)
class RunTimes:
    """One Dagster run's times (epoch seconds): queued (``RUN_ENQUEUED``), taken from the queue by the
    run coordinator to be launched (``RUN_STARTING``, which it reports as it dequeues), started and
    ended (its record)."""

    job: str
    status: str
    enqueued: float
    dequeued: float
    started: float
    ended: float


def run_times(instance) -> list[RunTimes]:  # noqa: ANN001 - a DagsterInstance
    from dagster import DagsterEventType

    runs = []
    for record in instance.get_run_records():
        run = record.dagster_run
        events = {e.dagster_event_type: e.timestamp for e in instance.all_logs(
            run.run_id, of_type={DagsterEventType.RUN_ENQUEUED, DagsterEventType.RUN_STARTING})}
        runs.append(RunTimes(run.job_name, run.status.value, events[DagsterEventType.RUN_ENQUEUED],
                             events[DagsterEventType.RUN_STARTING], record.start_time, record.end_time))
    return runs


def queued_behind_a_full_queue(runs: list[RunTimes], limit: int) -> int:
    """How many runs were still waiting in the queue at some moment when ``limit`` runs were out of it
    and not finished (the coordinator's own count): runs the limit held back."""
    held = set()
    for i, run in enumerate(runs):
        for moment in (r.dequeued for r in runs):
            if run.enqueued < moment < run.dequeued and sum(r.dequeued <= moment < r.ended for r in runs) >= limit:
                held.add(i)
                break
    return len(held)


# --- the clients -------------------------------------------------------------------------------------


class Load:
    """What the clients did: latencies per number of API processes and kind, each process's share,
    every failure, and the writes and chats the servers acknowledged."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latencies: dict[tuple[int, str], list[float]] = defaultdict(list)
        self.served: dict[int, Counter[str]] = defaultdict(Counter)
        self.failures: list[str] = []
        self.written: dict[str, tuple[str, str]] = {}  # memory id -> (user, content), as the API answered
        self.chats: list[tuple[str, str]] = []  # (user, the exchange) of each chat the proxy answered

    def post(self, processes: int, kind: str, client: httpx.Client, path: str, body: dict) -> httpx.Response | None:
        """``client.post(path, body)``, timed; a transport error is a failure (None)."""
        target = str(client.base_url).rstrip("/")
        started = time.perf_counter()
        try:
            response = client.post(path, json=body)
        except httpx.HTTPError as exc:
            with self.lock:
                self.failures.append(f"{kind} {target}: {type(exc).__name__} {exc}")
            return None
        elapsed = (time.perf_counter() - started) * 1000
        with self.lock:
            self.latencies[(processes, kind)].append(elapsed)
            self.served[processes][target] += 1
        return response

    def fail(self, what: str) -> None:
        with self.lock:
            self.failures.append(what)

    def percentile(self, processes: int, kind: str, q: float) -> float:
        return float(np.percentile(self.latencies[(processes, kind)], q))

    def count(self, processes: int, kind: str) -> int:
        return len(self.latencies[(processes, kind)])


@dataclass(frozen=True)
class Schedule:
    """Which API processes take requests when: ``WINDOW_SECONDS`` windows, one process and two in
    turn, so that both counts share alike whatever else the machine does meanwhile (Dagster's
    runs of what was written before, other jobs on a shared machine)."""

    start: float
    serve: list[str]

    @property
    def until(self) -> float:
        return self.start + LOAD_SECONDS

    def processes(self) -> int:
        """1 or 2: how many API processes take the requests starting now."""
        return 1 + int((time.monotonic() - self.start) // WINDOW_SECONDS) % 2

    def targets(self, processes: int) -> list[str]:
        return self.serve[:processes]


def api_client(load: Load, number: int, schedule: Schedule) -> None:
    """A new memory, then ``RECALLS_PER_WRITE`` recalls for its user, round robin over the API
    processes of the window."""
    user = _user(number)
    clients = {url: httpx.Client(base_url=url, headers={"X-API-Key": ADMIN_KEY}, timeout=60) for url in schedule.serve}
    try:
        k = 0
        while time.monotonic() < schedule.until:
            processes = schedule.processes()
            targets = schedule.targets(processes)
            client = clients[targets[(number + k) % len(targets)]]
            if k % (RECALLS_PER_WRITE + 1) == 0:
                content = _fact(f"{number}-{k}", number * 10_000 + k)
                response = load.post(processes, "write", client, "/api/memories/", {"user_id": user, "content": content})
                if response is not None:
                    if response.status_code == 201:
                        with load.lock:
                            load.written[response.json()["id"]] = (user, content)
                    else:
                        load.fail(f"write {client.base_url}: {response.status_code} {response.text[:300]}")
            else:
                word = WORDS[(number + k) % len(WORDS)]
                response = load.post(processes, "recall", client, "/api/context",
                                     {"user_id": user, "query": f"how many jars of {word} tea do I keep?"})
                if response is not None:
                    body = response.json() if response.status_code == 200 else None
                    if body is None or body["recall_error"] is not None or body["note"] is not None:
                        load.fail(f"recall {client.base_url}: {response.status_code} {response.text[:300]}")
            k += 1
    finally:
        for client in clients.values():
            client.close()


def proxy_client(load: Load, number: int, schedule: Schedule, proxy: str, key: str) -> None:
    """Chat through the memory proxy with the user's own key, a new thing said each time, with a
    pause to read the answer (``CHAT_PAUSE_SECONDS``)."""
    user = _user(number)
    with httpx.Client(base_url=proxy, headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
        k = 0
        while time.monotonic() < schedule.until:
            said = f"Remember that locker {number}-{k} is by the {WORDS[k % len(WORDS)]} door."
            response = load.post(schedule.processes(), "chat", client, "/v1/chat/completions",
                                 {"model": "fake-model", "messages": [{"role": "user", "content": said}]})
            if response is not None:
                answer = response.json()["choices"][0]["message"]["content"] if response.status_code == 200 else None
                if answer != f"You said: {said}":
                    load.fail(f"chat: {response.status_code} {response.text[:300]}")
                else:
                    with load.lock:
                        load.chats.append((user, f"User: {said}\nAssistant: You said: {said}"))
            k += 1
            time.sleep(CHAT_PAUSE_SECONDS)


def run_clients(load: Load, serve: list[str], proxy: str, keys: dict[str, str]) -> float:
    """``CLIENTS`` clients for ``LOAD_SECONDS``; returns the seconds until the last one finished."""
    schedule = Schedule(time.monotonic(), serve)
    threads = [threading.Thread(target=api_client, args=(load, n, schedule)) for n in range(CLIENTS - PROXY_CLIENTS)]
    threads += [threading.Thread(target=proxy_client, args=(load, n, schedule, proxy, keys[_user(n)]))
                for n in range(CLIENTS - PROXY_CLIENTS, CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=LOAD_SECONDS + 120)
        assert not thread.is_alive(), "a client did not finish"
    return time.monotonic() - schedule.start


# --- the test ----------------------------------------------------------------------------------------


def _in_flight(instance) -> int:  # noqa: ANN001
    import dagster as dg

    statuses = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
                dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]
    return len(instance.get_run_records(filters=dg.RunsFilter(statuses=statuses)))


def test_two_api_processes_a_proxy_and_four_dagster_runs_at_once_on_one_external_postgres(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from yak_pipeline.services.discovery import discover_work

    load = Load()
    timings: dict[str, float] = {}
    started = time.monotonic()
    with ExitStack() as stack:
        pg = stack.enter_context(external_postgres(max_connections=200))
        env = yak_env(pg.url, tmp_path / "home-migrate", YAK_ADMIN_API_KEY=ADMIN_KEY)
        migrated = subprocess.run([sys.executable, "-m", "yak_pipeline.cli.main", "db", "migrate"], env=env,
                                  capture_output=True, text=True, timeout=300)
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr
        # Dagster first: its code server takes longest to load, and loads while the rest starts.
        settings = Settings(home=tmp_path / "home-dagster", database_url=pg.url, embedder="hashing")
        dagster = stack.enter_context(yak_dagster(settings, pg.url))
        monkeypatch.setenv("YAK_DAGSTER_PG_URL", dagster.env["YAK_DAGSTER_PG_URL"])  # for dagster.instance()
        keys = {}
        with psycopg.connect(pg.url, autocommit=True) as conn:
            for n in range(USERS):
                keys[_user(n)] = create_api_key(conn, user_id=_user(n), label="multi-process test")[1]
        upstream = stack.enter_context(FakeOpenAIServer(chat_replier))
        servers = [stack.enter_context(yak_serve(yak_env(pg.url, tmp_path / f"home-serve-{n}",
                                                         YAK_ADMIN_API_KEY=ADMIN_KEY), tmp_path / f"serve-{n}"))
                   for n in (1, 2)]
        proxy = stack.enter_context(yak_serve(yak_env(
            pg.url, tmp_path / "home-proxy", YAK_ADMIN_API_KEY=ADMIN_KEY, YAK_UPSTREAM_BASE_URL=upstream.base_url,
            YAK_UPSTREAM_API_KEY=UPSTREAM_KEY), tmp_path / "proxy", command="proxy"))
        dagster.start_daemon()
        timings["start-up"] = time.monotonic() - started

        # Something to recall for every user before the clock starts (and a first queue for Dagster).
        with httpx.Client(base_url=servers[0].url, headers={"X-API-Key": ADMIN_KEY}, timeout=60) as client:
            for n in range(USERS * SEED_PER_USER):
                content = _fact(f"seed-{n}", n)
                response = client.post("/api/memories/", json={"user_id": _user(n), "content": content})
                assert response.status_code == 201, response.text
                load.written[response.json()["id"]] = (_user(n), content)

        timings["clients"] = run_clients(load, [s.url for s in servers], proxy.url, keys)
        phases_done = time.monotonic()
        load_average = os.getloadavg()[0]

        # The API and the proxy stop (the proxy stores the turns it answered as it stops) ...
        server_logs = []
        for server in [*servers, proxy]:
            server.process.terminate()
            assert server.process.wait(timeout=60) in (0, 143, -signal.SIGTERM), server.logs()[-3000:]
            server_logs.append(server.logs())
        # ... and the daemon runs what is left: no pending memory or turn, no run queued or running.
        db = stack.enter_context(Database(pg.url, max_size=2).open())
        instance = stack.enter_context(dagster.instance())
        deadline = time.monotonic() + DRAIN_SECONDS
        while True:
            assert dagster.alive(), dagster.logs()[-5000:]
            found = discover_work(db, drop_dir=None)
            if not found.memory_partitions and not found.turn_partitions and _in_flight(instance) == 0:
                break
            assert time.monotonic() < deadline, (
                f"the queue did not drain in {DRAIN_SECONDS:.0f} s: {len(found.memory_partitions)} memory and "
                f"{len(found.turn_partitions)} turn partitions pending, {_in_flight(instance)} runs in flight")
            time.sleep(1)
        timings["drain"] = time.monotonic() - phases_done
        runs = run_times(instance)
        coordinator = instance.run_coordinator
        with psycopg.connect(dagster.env["YAK_DAGSTER_PG_URL"].replace("+psycopg2", "")) as conn:
            runs_in_postgres = conn.execute("SELECT count(*) FROM runs").fetchone()[0]
        with db.connection() as conn:
            state = pipeline_state(conn)
            stored = {i: (u, c) for i, u, c in conn.execute("SELECT id::text, user_id, content FROM memories")}
            hashes = conn.execute("SELECT count(*), count(DISTINCT (user_id, content_sha256)) FROM memories").fetchone()
            turns = conn.execute("SELECT count(*), count(DISTINCT memory_id), count(*) FILTER "
                                 "(WHERE status <> 'evaluated') FROM turns").fetchone()
        dagster_logs = dagster.logs()
    timings["total"] = time.monotonic() - started

    # --- figures
    rows = []
    for processes in (1, 2):
        requests = sum(load.count(processes, kind) for kind in ("write", "recall", "chat"))
        rows.append({
            "api_processes": processes,
            "requests": requests,
            "per_process": dict(sorted(load.served[processes].items())),
            "writes": load.count(processes, "write"), "recalls": load.count(processes, "recall"),
            "chats": load.count(processes, "chat"),
            "recall_p50_ms": round(load.percentile(processes, "recall", 50), 1),
            "recall_p95_ms": round(load.percentile(processes, "recall", 95), 1),
            "write_p95_ms": round(load.percentile(processes, "write", 95), 1),
            "chat_p95_ms": round(load.percentile(processes, "chat", 95), 1),
            "requests_per_s": round(requests / (LOAD_SECONDS / 2), 1),
        })
    jobs = Counter(r.job for r in runs)
    figures = {"clients": CLIENTS, "load_seconds": LOAD_SECONDS, "window_seconds": WINDOW_SECONDS,
               "memories": hashes[0], "by_api_processes": rows, "runs": dict(jobs),
               "most_runs_started_at_once": max_overlap([(r.started, r.ended) for r in runs]),
               "most_runs_out_of_the_queue_at_once": max_overlap([(r.dequeued, r.ended) for r in runs]),
               "runs_held_back_by_the_limit": queued_behind_a_full_queue(runs, MAX_CONCURRENT_RUNS),
               "run_seconds_p50": round(float(np.median([r.ended - r.started for r in runs])), 1),
               "run_seconds_max": round(max(r.ended - r.started for r in runs), 1),
               "timings_s": {k: round(v, 1) for k, v in timings.items()},
               "load_average_1min_after_clients": round(load_average, 1), "cpus": os.cpu_count()}
    (tmp_path / "multi_process.json").write_text(json.dumps(figures, indent=2))
    table = ["api processes | requests (per s) | recall p50 | recall p95 | write p95 | chat p95 (proxy)"]
    table += [f"{r['api_processes']} | {r['requests']} ({r['requests_per_s']}) | {r['recall_p50_ms']:.0f} ms | "
              f"{r['recall_p95_ms']:.0f} ms | {r['write_p95_ms']:.0f} ms | {r['chat_p95_ms']:.0f} ms" for r in rows]
    with capsys.disabled():
        print("\n[multi-process] " + "\n[multi-process] ".join(table))
        print(f"[multi-process] {hashes[0]} memories; {len(runs)} Dagster runs ({dict(jobs)}), at most "
              f"{figures['most_runs_started_at_once']} running at once, {figures['runs_held_back_by_the_limit']} held "
              f"in the queue by the limit; timings {figures['timings_s']}; load average {load_average:.1f} on "
              f"{os.cpu_count()} cores; {tmp_path / 'multi_process.json'}")
    report_figure("Multi-process", json.dumps(figures))

    # --- 0 errors
    assert load.failures == [], load.failures[:10]
    for log in server_logs:
        assert "Traceback" not in log, log[-3000:]
    assert all(rows[0][k] > 0 for k in ("writes", "recalls", "chats")), rows[0]
    assert set(rows[1]["per_process"]) == {servers[0].url, servers[1].url, proxy.url}, rows[1]
    # --- 0 lost or duplicated rows: every acknowledged write stored once, nothing else stored
    assert {i: stored.get(i) for i in load.written} == load.written
    assert Counter(row for i, row in stored.items() if i not in load.written) == Counter(load.chats)
    assert len(set(load.chats)) == len(load.chats) and hashes[0] == hashes[1] == len(load.written) + len(load.chats)
    assert turns == (len(load.chats), len(load.chats), 0)  # one turn per chat, each evaluated
    # --- the pipeline distilled everything once, under four concurrent runs
    assert state.violations == [], state.violations
    assert (state.memories, state.distilled, state.pending, state.failed) == (hashes[0], hashes[0], 0, 0)
    assert [r for r in runs if r.status != "SUCCESS"] == [], dagster_logs[-5000:]
    for word in ("Traceback", "ERROR"):
        assert word not in dagster_logs, dagster_logs[-5000:]
    assert jobs["memory_job"] >= USERS and jobs["warmth_job"] >= 1, jobs
    # Dagster's own storage is that server's `dagster` database, and its run queue is the project's.
    assert runs_in_postgres == len(runs)
    assert type(coordinator).__name__ == "QueuedRunCoordinator"
    assert coordinator.get_run_queue_config().max_concurrent_runs == MAX_CONCURRENT_RUNS
    # Four ran at once, never more, and the limit held runs back in the queue meanwhile.
    assert figures["most_runs_out_of_the_queue_at_once"] == MAX_CONCURRENT_RUNS, figures
    assert figures["most_runs_started_at_once"] == MAX_CONCURRENT_RUNS, figures
    assert figures["runs_held_back_by_the_limit"] > 0, figures
