"""Shared parts of the benchmark scripts: a scratch database, percentiles, the table and the JSON file.

Every benchmark works in its own database on the configured server (``yak_bench_<random>``),
never in the user's data, and drops it at the end (also on Ctrl-C).
"""

from __future__ import annotations

import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from yak_pipeline.ports import free_port  # noqa: E402,F401 - the benchmarks import it from here
from yak_pipeline.settings import Settings  # noqa: E402
from yak_pipeline.store.database import connect, resolve_database_url, with_database  # noqa: E402


def progress(line: str) -> None:
    """Progress goes to stderr, so ``--json`` output on stdout stays clean."""
    print(line, file=sys.stderr, flush=True)


@contextmanager
def scratch_database(settings: Settings, *, keep: bool = False) -> Iterator[str]:
    """A new, migrated database on the configured server; its URL. Dropped afterwards unless ``keep``."""
    from yak_pipeline.wiring import migrate_database

    server = resolve_database_url(settings)
    name = f"yak_bench_{uuid.uuid4().hex[:12]}"
    with connect(server, autocommit=True, vector=False) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = with_database(server, name)
    try:
        migrate_database(settings, url)
        yield url
    finally:
        if keep:
            progress(f"kept database {name}")
        else:
            with connect(server, autocommit=True, vector=False) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def reused_database(settings: Settings, name: str) -> Iterator[str]:
    """The URL of database ``name`` on the configured server, kept by an earlier run (``--keep``); kept again."""
    url = with_database(resolve_database_url(settings), name)
    try:
        connect(url, vector=False).close()
    except Exception as error:  # noqa: BLE001 - a one-line reason instead of a traceback
        raise SystemExit(f"error: cannot open database {name!r}: {str(error).strip().splitlines()[0]}") from None
    yield url


@contextmanager
def running_yak(command: str, env: dict[str, str], *, startup_seconds: float = 120, port_option: str = "--port",
                extra_args: Sequence[str] = ()) -> Iterator[int]:
    """``yak <command> --port P`` in a subprocess on a free port, once its ``/health`` answers; yields P.

    ``yak up`` names its API port ``--api-port`` (``port_option``); ``extra_args`` go after it.

    The process is stopped (terminate, then kill after 20 s) when the block ends, whatever happens.
    """
    import httpx

    port = free_port()
    # A file, not a pipe: a long run's logs would fill a pipe nobody reads and block the server.
    errors = tempfile.TemporaryFile()
    process = subprocess.Popen([sys.executable, "-m", "yak_pipeline.cli.main", command, port_option, str(port),
                                *extra_args], env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=errors)
    try:
        deadline = time.monotonic() + startup_seconds
        with httpx.Client(timeout=10) as client:
            while True:
                try:
                    if client.get(f"http://127.0.0.1:{port}/health").status_code < 500:
                        break
                except httpx.TransportError:
                    pass
                if process.poll() is not None or time.monotonic() > deadline:
                    errors.seek(0)
                    detail = errors.read().decode(errors="replace")[-500:]
                    raise RuntimeError(f"yak {command} did not start: {detail}")
                time.sleep(0.5)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
        errors.close()


def freeze_heap() -> None:
    """Exempt what this process holds so far (the corpus, the questions) from garbage collection.

    A benchmark keeps its corpus in its own heap, which a server does not: full collections over it
    paused measured requests for up to 210 ms (8 of them in one recall_latency run). Frozen, the
    collector leaves it alone; what the measured work allocates is collected as in a server.
    """
    gc.collect()
    gc.freeze()


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-pct * len(ordered) // 100))))
    return float(ordered[rank - 1])


def latency_summary(samples_ms: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99 and mean of latency samples, in milliseconds."""
    return {"p50": round(percentile(samples_ms, 50), 2), "p95": round(percentile(samples_ms, 95), 2),
            "p99": round(percentile(samples_ms, 99), 2),
            "mean": round(sum(samples_ms) / len(samples_ms), 2) if samples_ms else 0.0, "n": len(samples_ms)}


def machine() -> dict[str, object]:
    """What the figures were measured on."""
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "processor": platform.processor() or platform.machine()}


def print_table(title: str, rows: list[tuple[str, str, str, str]],
                headers: tuple[str, str, str, str] = ("measure", "figure", "target", "verdict")) -> None:
    """(measure, figure, target, verdict) rows (or other ``headers``) as a table on stdout."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for position, header in enumerate(headers):
        table.add_column(header, justify="left" if position == 0 else "right")
    for row in rows:
        table.add_row(*row)
    Console(width=max(Console().width, 110)).print(table)


def write_result(name: str, payload: dict, out_dir: Path = RESULTS) -> Path:
    """Write ``payload`` (plus when and where) to ``bench/results/<name>.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {**payload, "machine": machine(), "finished_at": datetime.now(UTC).isoformat(timespec="seconds")}
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def verdict(value: float, target: float, *, higher_is_better: bool) -> str:
    """``met`` / ``missed`` for a figure against its target."""
    ok = value >= target if higher_is_better else value <= target
    return "met" if ok else "missed"
