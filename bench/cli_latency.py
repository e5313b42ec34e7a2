"""How long each `yak` command takes with `yak up` running, and in-process without a server.

``python bench/cli_latency.py [--runs 5] [--no-in-process] [--json]``

Starts ``yak up`` (embedded PostgreSQL, Dagster webserver and daemon, the API) in a fresh
``YAK_HOME`` on free ports, adds a few memories through the CLI, waits until they are distilled
(nothing pending) and 15 s more, so that the commands are timed on a settled server rather than
during start-up and the runs the additions started, then runs every read and write
command a user types ``--runs`` times as a real subprocess (the ``yak`` console script, as a
shell runs it) and reports the median and the slowest wall-clock time per command. With the
server running the CLI finds it through ``$YAK_HOME/server.json`` and sends its requests
there, with no flag. For comparison each command is then timed once in-process (the server
stopped, ``YAK_API_URL`` unset: the embedder loaded and the database opened in the command's
own process), unless ``--no-in-process``.

``yak --help`` is timed ``--runs`` times too (it needs no server). The JSON's ``commands`` holds
each command's ``median``, ``max`` and ``target``; the per-run times stay in
``server_up_seconds`` (``help_seconds`` for ``--help``).

The ``yak`` console script imports the ``yak_pipeline`` found first: to time another checkout
than the installed one, put it on ``PYTHONPATH`` (the commands inherit it).

The commands run as a shell runs them from an installed Yak, with their bytecode compiled
(``PYTHONDONTWRITEBYTECODE`` is dropped from their environment: with it set, every run compiles
every module it imports again, which no installed ``yak`` does).

Targets (issue 37, "A CLI under one second, always"): every command's median < 1 s with a server
running, ``yak --help`` < 0.3 s. The 1-minute load average is recorded: the figures are only as
quiet as the machine was.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import free_port, print_table, progress, running_yak, verdict, write_result  # noqa: E402

YAK = Path(sys.executable).parent / "yak"
TARGET_SECONDS = 1.0
HELP_TARGET_SECONDS = 0.3
HELP = "--help"
FACTS = ["I keep two beehives on the roof.", "My sister Ines lives in Porto.", "I prefer strong black coffee.",
         "I run 5 km every morning before work.", "My daughter turns six in March."]


def _run(args: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    done = subprocess.run([str(YAK), *args], env=env, capture_output=True, text=True, timeout=300)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"yak {' '.join(args)} failed: {done.stderr.strip()[-300:]}")
    return elapsed, done


def _commands(memory_id: str) -> list[list[str]]:
    """What a user types, reads first; the writes (add, forget) are undone by the next run's own."""
    return [
        ["health", "--json"],
        ["memory", "list", "--user", "ana", "--json"],
        ["memory", "show", memory_id, "--json"],
        ["memory", "search", "what do I drink in the morning", "--user", "ana", "--json"],
        ["distill", "list", "--user", "ana", "--json"],
        ["review", "list", "--json"],
        ["conflicts", "list", "--user", "ana", "--json"],
        ["queue", "status", "--json"],
        ["keys", "list", "--json"],
        ["metrics", "--json"],
        ["memory", "add", "User: I also grow tomatoes.\nAssistant: Nice.", "--user", "ana", "--json"],
        ["forget", "tomatoes", "--user", "ana", "--yes", "--json"],
        ["db", "status", "--json"],
    ]


def _name(args: list[str]) -> str:
    """The command's name in the results: ``memory show`` for ``memory show <id> --json``."""
    return " ".join(a for a in args[:2] if not a.startswith("-") and len(a) < 20) or " ".join(args)


def _time_all(commands: list[list[str]], env: dict[str, str], runs: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {}
    for args in commands:
        name = _name(args)
        for _ in range(runs):
            elapsed, _done = _run(args, env)
            times.setdefault(name, []).append(elapsed)
        progress(f"  yak {name}: median {statistics.median(times[name]):.2f} s")
    return times


def _settle(env: dict[str, str], timeout: float = 240.0) -> float:
    """Wait until yak up has distilled the memories just added (nothing pending), then 15 s more.

    ``yak up`` starts its Dagster daemon, webserver and code server, and the added memories start
    runs: on 2 cores they take the CPU for a minute or more, and the commands timed then measure
    that, not themselves. The commands' own writes (add, forget) still start runs as they would.
    Returns the seconds waited.
    """
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        status = json.loads(_run(["queue", "status", "--json"], env)[1].stdout)
        if status["pending_memories"] == 0 and status["pending_turns"] == 0:
            break
        time.sleep(2)
    time.sleep(15)
    waited = time.monotonic() - started
    progress(f"  settled after {waited:.0f} s (load average {os.getloadavg()[0]:.2f})")
    return waited


def main() -> None:
    """Parse the arguments, run the measurements, print the table and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each command with the server up (default 5)")
    parser.add_argument("--no-in-process", action="store_true", help="skip the in-process comparison")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="yak-cli-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("YAK_") and k != "PYTHONDONTWRITEBYTECODE"}
    env.update(YAK_HOME=str(home))
    load_before = os.getloadavg()[0]
    try:
        progress(f"starting yak up in {home} …")
        with running_yak("up", env, startup_seconds=300, port_option="--api-port",
                         extra_args=["--dagster-port", str(free_port())]):
            assert (home / "server.json").exists(), "yak up's API did not record itself"
            ids = [json.loads(_run(["memory", "add", f"User: {fact}\nAssistant: Noted.", "--user", "ana", "--json"],
                                   env)[1].stdout)["id"] for fact in FACTS]
            commands = _commands(ids[0])
            settled = _settle(env)
            # --help first: the writes timed last start pipeline runs that hold the CPU for a while.
            progress(f"timing yak {HELP} × {args.runs} …")
            helped = _time_all([[HELP]], env, args.runs)[HELP]
            progress(f"timing {len(commands)} commands × {args.runs} with the server up …")
            served = _time_all(commands, env, args.runs)
        in_process: dict[str, list[float]] = {}
        if not args.no_in_process:
            progress("timing each command once in-process (no server) …")
            in_process = _time_all(commands, env, 1)
    finally:
        subprocess.run([str(YAK), "db", "stop"], env=env, capture_output=True, timeout=60)
        shutil.rmtree(home, ignore_errors=True)
    load_after = os.getloadavg()[0]

    rows = []
    summary: dict[str, dict[str, float]] = {}
    for name, samples in [*served.items(), (HELP, helped)]:
        median = statistics.median(samples)
        target = HELP_TARGET_SECONDS if name == HELP else TARGET_SECONDS
        summary[name] = {"median": round(median, 3), "max": round(max(samples), 3), "target": target}
        label = f"yak {name} (median / max of {len(samples)})" if name == HELP else \
            f"yak {name} (server up: median / max of {len(samples)})"
        rows.append((label, f"{median:.2f} / {max(samples):.2f} s", f"median < {target:g} s",
                     verdict(median, target, higher_is_better=False)))
        if name in in_process:
            rows.append((f"yak {name} (in-process, no server)", f"{in_process[name][0]:.2f} s", "-", "-"))
    slowest = max(max(s) for s in served.values())
    slowest_median = max(statistics.median(s) for s in served.values())
    rows.append(("slowest median with the server up", f"{slowest_median:.2f} s", f"< {TARGET_SECONDS:g} s",
                 verdict(slowest_median, TARGET_SECONDS, higher_is_better=False)))
    rows.append(("slowest single run with the server up", f"{slowest:.2f} s", "-", "-"))
    rows.append(("load average (1 min) before / after", f"{load_before:.2f} / {load_after:.2f}", "-", "-"))
    rows.append(("waited for yak up to settle (nothing pending, then 15 s)", f"{settled:.0f} s", "-", "-"))
    payload = {"runs": args.runs, "target_seconds": TARGET_SECONDS, "load_average": [load_before, load_after],
               "settle_seconds": round(settled, 1),
               "help_target_seconds": HELP_TARGET_SECONDS,
               "commands": summary,
               "server_up_seconds": {n: [round(x, 3) for x in s] for n, s in served.items()},
               "help_seconds": [round(x, 3) for x in helped],
               "in_process_seconds": {n: [round(x, 3) for x in s] for n, s in in_process.items()},
               "slowest_server_up_seconds": round(slowest, 3),
               "slowest_server_up_median_seconds": round(slowest_median, 3)}
    path = write_result("cli_latency", payload)
    if args.json:
        print(json.dumps(payload, indent=2))
    else:
        print_table("yak commands, wall-clock, with yak up running", rows)
        print(f"written to {path}")


if __name__ == "__main__":
    main()
