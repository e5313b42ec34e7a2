"""Freshness with the daemon on: ``python bench/freshness.py --trials 10 [--json]``.

Runs ``yak up`` in a subprocess on a scratch ``YAK_HOME`` (embedded PostgreSQL, offline rules LLM
provider, local MiniLM embedder — the defaults, no network) with free ports, then, for each trial,
one at a time on an otherwise idle instance:

- **drop → recallable** — writes a drop file holding one new exchange for a fresh user (today's
  partition) and polls ``GET /api/distillations`` until its distillation is active, then
  ``POST /api/distillations/search`` until it is recalled;
- **turn → warmth** — posts ``POST /api/turns`` for that user, recalling that distillation, with
  an answer that plainly uses it (the rules provider scores it relevant, warmth +0.1), and polls
  ``GET /api/warmth/{id}`` until the warmth changes.

The clock starts when the file lands (renamed into the folder) or just before the POST, and
stops at the first poll (every 0.25 s) that sees the result. Afterwards the Dagster instance's
run records give each trial's breakdown: until the sensor created the run (tick wait, and for
files the drop folder's 2 s "still being written" age), in the queue (until the run coordinator
dequeued it), run start-up (launch, process start, loading the job, until the run started), and
the run until the poll saw the result (poll lag included); and the whole run, which for a memory
run goes on after the distillation is recallable (quality check, conflict scores, merges). The
1-minute load average is recorded with each trial: on a shared machine it explains most spread.

Targets (issue 5): p95 ≤ 15 s each. Runs still going after the last trial are waited for; then
everything ``yak up`` started, and the embedded database, is stopped, also on failure or Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, free_port, percentile, print_table, progress, verdict, write_result  # noqa: E402

TARGETS = {"drop_p95_s": 15.0, "turn_p95_s": 15.0}
POLL_SECONDS = 0.25
_NAMES = ["sourdough starter", "kayak", "bonsai tree", "vintage bicycle", "chess club", "beehive", "violin",
          "allotment shed", "telescope", "rescue greyhound", "narrowboat", "pottery wheel"]
_CITIES = ["Leeds", "Lisbon", "Oslo", "Tokyo", "Lima", "Seoul", "Madrid", "Berlin", "Chicago", "Lagos"]


def _clean_env(home: Path, admin_key: str) -> dict[str, str]:
    """The caller's environment without any Yak or Dagster configuration, on the scratch home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("YAK_", "DAGSTER_"))}
    env.update({"YAK_HOME": str(home), "YAK_ADMIN_API_KEY": admin_key, "PYTHONUNBUFFERED": "1"})
    return env


class YakUp:
    """``yak up`` in a subprocess on a scratch home; :meth:`stop` ends it, its children and the database."""

    def __init__(self, home: Path, env: dict[str, str], log_path: Path) -> None:
        self.home, self.env, self.log_path = home, env, log_path
        self.api_port, self.dagster_port = free_port(), free_port()
        self.process: subprocess.Popen | None = None
        self._log = None
        self._known: dict[int, object] = {}

    def start(self) -> None:
        """Start ``yak up`` (its own session, so a Ctrl-C at the terminal reaches it only through us)."""
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "yak_pipeline.cli.main", "up", "--api-port", str(self.api_port),
             "--dagster-port", str(self.dagster_port)],
            env=self.env, cwd=str(self.home), stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def remember_children(self) -> None:
        """Note every process ``yak up`` has started so far (run workers come and go; call it often)."""
        import psutil

        if self.process is None:
            return
        try:
            for child in psutil.Process(self.process.pid).children(recursive=True):
                self._known.setdefault(child.pid, child)
        except psutil.NoSuchProcess:
            pass

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM ``yak up`` (it stops its children), then make sure each of them is gone, then
        stop the embedded database."""
        import psutil

        self.remember_children()
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        leftovers, names = [], []
        for proc in self._known.values():
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    names.append(f"{proc.pid} {' '.join(proc.cmdline())[:80]}")
                    proc.terminate()
                    leftovers.append(proc)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(leftovers, timeout=10)
        for proc in alive:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        if leftovers:
            progress(f"stopped {len(leftovers)} process(es) yak up left behind: " + "; ".join(names))
        if self._log is not None:
            self._log.close()
        subprocess.run([sys.executable, "-m", "yak_pipeline.cli.main", "db", "stop"], env=self.env,
                       cwd=str(self.home), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60,
                       check=False)
        self._stop_stray_postgres()

    def _stop_stray_postgres(self) -> None:
        """If the embedded server still runs (``yak db stop`` failed), stop it by its pid file."""
        pid_file = self.home / "pgdata" / "postmaster.pid"
        try:
            pid = int(pid_file.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return
        try:
            os.kill(pid, signal.SIGINT)  # PostgreSQL's "fast" shutdown
        except ProcessLookupError:
            return
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        progress(f"embedded PostgreSQL (pid {pid}) did not stop")


def _wait_ready(up: YakUp, client, timeout: float) -> None:
    """Until the API answers and has its embedder loaded (one search)."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        if not up.alive():
            raise RuntimeError(f"yak up exited:\n{up.log_tail()}")
        try:
            if client.get("/health").status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the API did not come up in {timeout:.0f}s:\n{up.log_tail()}")
        time.sleep(0.5)
    up.remember_children()
    response = client.post("/api/distillations/search", json={"query": "warm up", "user_id": "bench-warmup"})
    response.raise_for_status()


def _poll(check, timeout: float, up: YakUp) -> tuple[float, object]:
    """Call ``check()`` every POLL_SECONDS until it returns something; (epoch seconds seen, value)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return time.time(), value
        if not up.alive():
            raise RuntimeError(f"yak up exited:\n{up.log_tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing after {timeout:.0f}s")
        up.remember_children()
        time.sleep(POLL_SECONDS)


def drop_trial(client, up: YakUp, drop_dir: Path, user: str, index: int, timeout: float) -> dict:
    """A file with one new exchange lands in the drop folder; seconds until its memory is recalled."""
    token = f"Quill{uuid.uuid4().hex[:6]}"
    thing, city = _NAMES[index % len(_NAMES)], _CITIES[index % len(_CITIES)]
    said = f"I named my {thing} {token}; we live in {city}."
    record = {"user_id": user, "user": said, "assistant": f"{token} is a lovely name.",
              "occurred_at": datetime.now(UTC).isoformat()}
    name = f"freshness-{user}.jsonl"
    staged = drop_dir / f".{name}.part"  # hidden files are skipped; the rename makes it appear whole
    staged.write_text(json.dumps(record) + "\n")
    landed = time.time()
    os.replace(staged, drop_dir / name)

    def recalled():
        # The cheap list first (a search embeds the query: polling it would load the machine),
        # then the search that proves it recallable.
        listed = client.get("/api/distillations", params={"user_id": user, "status": "active", "limit": 5})
        listed.raise_for_status()
        if not any(token in item["content"] for item in listed.json()["items"]):
            return None
        response = client.post("/api/distillations/search", json={"query": said, "user_id": user, "limit": 5})
        response.raise_for_status()
        return next((hit for hit in response.json() if token in hit["content"]), None)

    seen, hit = _poll(recalled, timeout, up)
    return {"user": user, "started": landed, "seen": seen, "seconds": round(seen - landed, 3),
            "distillation_id": hit["id"], "content": hit["content"], "loadavg_1m": round(os.getloadavg()[0], 2)}


def turn_trial(client, up: YakUp, user: str, distillation_id: str, content: str, timeout: float) -> dict:
    """A turn that used a recalled memory is posted; seconds until that memory's warmth changes."""
    before = client.get(f"/api/warmth/{distillation_id}").json()["warmth"]
    body = {"user_id": user, "user_message": f"Remind me what I told you ({uuid.uuid4().hex[:6]})?",
            "assistant_message": f"You told me this: {content}", "recalled_ids": [distillation_id]}
    posted = time.time()
    response = client.post("/api/turns", json=body)
    response.raise_for_status()

    def changed():
        warmth = client.get(f"/api/warmth/{distillation_id}").json()["warmth"]
        return {"warmth": warmth} if warmth != before else None

    seen, after = _poll(changed, timeout, up)
    return {"user": user, "started": posted, "seen": seen, "seconds": round(seen - posted, 3),
            "turn_id": response.json()["turn_id"], "warmth_before": before, "warmth_after": after["warmth"],
            "loadavg_1m": round(os.getloadavg()[0], 2)}


def _dagster_url(up: YakUp) -> str:
    out = subprocess.run([sys.executable, "-m", "yak_pipeline.cli.main", "db", "url", "--dagster", "--show-password"],
                         env=up.env, cwd=str(up.home), capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip().splitlines()[-1]


def wait_for_runs(up: YakUp, timeout: float) -> int:
    """Until no run is queued or in progress (so stopping interrupts none); the runs still going."""
    import dagster as dg

    os.environ["YAK_DAGSTER_PG_URL"] = _dagster_url(up)
    busy = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
            dg.DagsterRunStatus.STARTED]
    deadline = time.monotonic() + timeout
    with dg.DagsterInstance.from_config(str(up.home / "dagster")) as instance:
        while True:
            going = instance.get_runs_count(dg.RunsFilter(statuses=busy))
            if not going or time.monotonic() > deadline:
                return going
            time.sleep(1)


def run_breakdown(up: YakUp, trials: list[dict], job: str, trigger: str) -> None:
    """Add each trial's phases, from the run the sensor launched for it (``run`` on the trial)."""
    import dagster as dg

    os.environ["YAK_DAGSTER_PG_URL"] = _dagster_url(up)
    with dg.DagsterInstance.from_config(str(up.home / "dagster")) as instance:
        for trial in trials:
            records = instance.get_run_records(dg.RunsFilter(
                job_name=job, tags={"dagster/partition": f"{trial['day']}|{trial['user']}", "yak/trigger": trigger}))
            if not records:
                continue
            record = min(records, key=lambda r: r.create_timestamp.timestamp())
            stamps: dict[str, float] = {}
            for entry in instance.all_logs(record.dagster_run.run_id):
                event = entry.dagster_event
                if event is None:
                    continue
                name = event.event_type.name  # RUN_START etc. (the values are the legacy PIPELINE_*)
                if name in ("RUN_ENQUEUED", "RUN_DEQUEUED", "RUN_STARTING", "RUN_START", "RUN_SUCCESS", "RUN_FAILURE"):
                    stamps.setdefault(name, entry.timestamp)
                if name in ("STEP_START", "STEP_SUCCESS") and event.step_key:
                    stamps.setdefault(f"{name}:{event.step_key}", entry.timestamp)
            created = record.create_timestamp.timestamp()
            dequeued = stamps.get("RUN_DEQUEUED", stamps.get("RUN_STARTING", created))
            started = stamps.get("RUN_START", dequeued)
            ended = stamps.get("RUN_SUCCESS", stamps.get("RUN_FAILURE", trial["seen"]))
            phases = {
                "to_run_created": created - trial["started"],
                "queued": dequeued - created,
                "run_startup": started - dequeued,
                "run_until_seen": trial["seen"] - started,  # the run's work until the poll saw the result
                "whole_run": ended - started,  # a memory run goes on (quality check, conflicts, merges)
            }
            steps = {}
            for key, value in stamps.items():
                if key.startswith("STEP_START:"):
                    step = key.split(":", 1)[1]
                    done = stamps.get(f"STEP_SUCCESS:{step}")
                    if done is not None:
                        steps[step] = round(done - value, 3)
            trial["run_id"] = record.dagster_run.run_id
            trial["phases"] = {k: round(v, 3) for k, v in phases.items()}
            trial["steps"] = steps
            trial["runs_for_partition"] = len(records)


def _summary(values: list[float]) -> dict[str, float]:
    return {"p50": round(percentile(values, 50), 2), "p95": round(percentile(values, 95), 2),
            "max": round(max(values), 2) if values else 0.0,
            "mean": round(sum(values) / len(values), 2) if values else 0.0, "n": len(values)}


def _phase_summary(trials: list[dict]) -> dict[str, dict[str, float]]:
    names = ("to_run_created", "queued", "run_startup", "run_until_seen", "whole_run")
    with_phases = [t for t in trials if "phases" in t]
    out = {name: _summary([t["phases"][name] for t in with_phases]) for name in names}
    steps = sorted({s for t in with_phases for s in t["steps"]})
    for step in steps:
        out[f"step {step}"] = _summary([t["steps"][step] for t in with_phases if step in t["steps"]])
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print (or emit as JSON) its figures next to the targets."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10, help="trials of each kind (default 10; at least 10 for p95)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds one trial may take (default 180)")
    parser.add_argument("--startup-timeout", type=float, default=300.0, help="seconds yak up may take to start")
    parser.add_argument("--settle", type=float, default=3.0, help="idle seconds between trials (default 3)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch YAK_HOME (its path is printed)")
    parser.add_argument("--name", default="freshness", help="result file bench/results/<name>.json")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    if args.trials < 1:
        print("error: --trials must be positive", file=sys.stderr)
        return 2
    import httpx

    home = Path(tempfile.mkdtemp(prefix="yak-freshness-"))
    (home / ".examples-seeded").write_text("the benchmark drops its own files\n")  # no example data
    admin_key = secrets.token_urlsafe(24)
    up = YakUp(home, _clean_env(home, admin_key), home / "yak-up.log")
    drop_dir = home / "drop"
    drop_dir.mkdir()
    tag = uuid.uuid4().hex[:6]
    drops: list[dict] = []
    turns: list[dict] = []
    started = time.monotonic()

    def _terminate(*_: object) -> None:
        raise KeyboardInterrupt

    previous_term = signal.signal(signal.SIGTERM, _terminate)
    try:
        progress(f"starting yak up on {home} (API :{up.api_port}, Dagster UI :{up.dagster_port})")
        up.start()
        with httpx.Client(base_url=f"http://127.0.0.1:{up.api_port}", headers={"X-API-Key": admin_key},
                          timeout=30) as client:
            _wait_ready(up, client, args.startup_timeout)
            startup_seconds = round(time.monotonic() - started, 1)
            progress(f"yak up ready in {startup_seconds}s; warm-up trial (not counted)")
            warm = drop_trial(client, up, drop_dir, f"warm-{tag}", 99, args.timeout)
            turn_trial(client, up, warm["user"], warm["distillation_id"], warm["content"], args.timeout)
            progress(f"  warm-up: drop {warm['seconds']:.1f}s")
            for i in range(args.trials):
                time.sleep(args.settle)
                user = f"fresh-{tag}-{i}"
                drop = drop_trial(client, up, drop_dir, user, i, args.timeout)
                drop["day"] = datetime.fromtimestamp(drop["started"], UTC).date().isoformat()
                drops.append(drop)
                time.sleep(args.settle)
                turn = turn_trial(client, up, user, drop["distillation_id"], drop["content"], args.timeout)
                turn["day"] = datetime.fromtimestamp(turn["started"], UTC).date().isoformat()
                turns.append(turn)
                progress(f"  trial {i + 1}/{args.trials}: drop → recallable {drop['seconds']:.1f}s, "
                         f"turn → warmth {turn['seconds']:.1f}s ({turn['warmth_before']} → {turn['warmth_after']})")
        going = wait_for_runs(up, args.timeout)
        if going:
            progress(f"{going} run(s) still going after {args.timeout:.0f}s; stopping anyway")
        run_breakdown(up, drops, "memory_job", "drop")
        run_breakdown(up, turns, "warmth_job", "turns")
    except KeyboardInterrupt:
        progress("interrupted; stopping yak up")
        return 130
    finally:
        progress("stopping yak up and the embedded database")
        up.stop()
        signal.signal(signal.SIGTERM, previous_term)
        if args.keep:
            progress(f"kept {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)

    dagster_yaml = (ROOT / "dagster.yaml").read_text()
    result = {
        "trials": args.trials,
        "drop_to_recallable_s": _summary([d["seconds"] for d in drops]),
        "turn_to_warmth_s": _summary([t["seconds"] for t in turns]),
        "drop_phases_s": _phase_summary(drops),
        "turn_phases_s": _phase_summary(turns),
        "targets": TARGETS,
        "startup_seconds": startup_seconds,
        "loadavg_1m": {"p50": round(percentile([t["loadavg_1m"] for t in drops + turns], 50), 2),
                       "max": max((t["loadavg_1m"] for t in drops + turns), default=0.0)},
        "dagster_yaml": dagster_yaml,
        "drop_trials": drops,
        "turn_trials": turns,
        "seconds": round(time.monotonic() - started, 1),
    }
    path = write_result(args.name, result)
    if args.json:
        print(json.dumps(result))
        return 0
    rows = []
    for label, key, target in (("drop file → recallable", "drop_to_recallable_s", "drop_p95_s"),
                               ("POST /api/turns → warmth change", "turn_to_warmth_s", "turn_p95_s")):
        s = result[key]
        rows.append((f"{label} p50 / p95 / max s", f"{s['p50']} / {s['p95']} / {s['max']}",
                     f"p95 ≤ {TARGETS[target]:g}", verdict(s["p95"], TARGETS[target], higher_is_better=False)))
    rows.append(("1-minute load average during the trials, p50 / max",
                 f"{result['loadavg_1m']['p50']} / {result['loadavg_1m']['max']}", f"{os.cpu_count()} cores", ""))
    for label, key in (("drop", "drop_phases_s"), ("turn", "turn_phases_s")):
        for phase, s in result[key].items():
            rows.append((f"  {label}: {phase} p50 / p95 s", f"{s['p50']} / {s['p95']}", "", ""))
    print_table(f"Freshness with the daemon on, {args.trials} trials each (2-core machine, timings noisy)", rows)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
