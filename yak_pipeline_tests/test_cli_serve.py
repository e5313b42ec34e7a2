"""The CLI against a real ``yak serve`` subprocess on 127.0.0.1 (the issue's "done when", minus Dagster)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from yak_pipeline.cli.main import app as yak
from yak_pipeline.embeddings.hashing import HashingEmbedder
from yak_pipeline.llm import RulesProvider
from yak_pipeline.ports import free_port
from yak_pipeline.services.distill import DistillJob, distill_memories
from yak_pipeline.settings import get_settings
from yak_pipeline.store.database import Database
from yak_pipeline_tests.api_fixtures import rows_mentioning

YAK = Path(sys.executable).parent / "yak"
STARTUP_SECONDS = 30


@dataclass(frozen=True)
class Server:
    """A running ``yak serve``."""

    url: str
    home: Path
    stdout: Path


def start_serve(env: dict[str, str], folder: Path, *, startup_seconds: float = STARTUP_SECONDS
                ) -> tuple[subprocess.Popen, str, Path]:
    """``yak serve`` on a free port of 127.0.0.1 with ``env``, once ``/health`` answers: (process, url, stdout file)."""
    port = free_port()
    out, err = folder / "serve.out", folder / "serve.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        process = subprocess.Popen([str(YAK), "serve", "--host", "127.0.0.1", "--port", str(port)], env=env,
                                   stdout=stdout, stderr=stderr)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + startup_seconds
    try:
        while True:
            assert process.poll() is None, err.read_text()
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    return process, url, out
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"yak serve did not start: {err.read_text()}"
            time.sleep(0.1)
    except BaseException:
        stop_serve(process)
        raise


def stop_serve(process: subprocess.Popen) -> None:
    """Terminate a ``yak serve`` started by :func:`start_serve` (kill it if it does not stop)."""
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture
def server(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    """``yak serve`` on a free port, on the test database with the hashing embedder."""
    home = tmp_path / "serve-home"
    env = {**os.environ, "YAK_DATABASE_URL": db_url, "YAK_EMBEDDER": "hashing", "YAK_HOME": str(home)}
    process, url, out = start_serve(env, tmp_path)
    try:
        # The CLI in this process reads the same YAK_HOME (for the stored admin key).
        for name, value in (("YAK_DATABASE_URL", db_url), ("YAK_EMBEDDER", "hashing"), ("YAK_HOME", str(home))):
            monkeypatch.setenv(name, value)
        get_settings.cache_clear()
        yield Server(url, home, out)
    finally:
        stop_serve(process)


def _ok(result) -> object:  # noqa: ANN001
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


def test_cli_against_a_real_server(server: Server, database: Database) -> None:
    runner = CliRunner()

    def remote(*args: str, key: str | None = None):  # noqa: ANN202
        extra = ["--remote", server.url] + (["--api-key", key] if key else [])
        return runner.invoke(yak, [*args, *extra])

    # First start: an admin key was created and stored where the server said, readable by its owner only.
    key_file = server.home / "admin-api-key"
    assert f"admin API key stored in {key_file}" in server.stdout.read_text()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600

    alice = _ok(remote("memory", "add", "User: My sister is called Ines.\nAssistant: Nice name.", "--user", "alice",
                       "--json"))
    bob = _ok(remote("memory", "add", "User: My sister is called Marta.\nAssistant: Lovely.", "--user", "bob",
                     "--json"))
    report = distill_memories(DistillJob(database, llm=RulesProvider(), embedder=HashingEmbedder(384),
                                         prompt_version="v1"), [alice["id"], bob["id"]])
    assert report.rows_out == 2

    # The console script itself, as a user runs it.
    searched = subprocess.run(
        [str(YAK), "memory", "search", "What is my sister called? Ines", "--user", "alice", "--threshold", "0.1",
         "--json", "--remote", server.url], capture_output=True, text=True, timeout=60,
        env={**os.environ, "YAK_HOME": str(server.home), "YAK_DATABASE_URL": "", "YAK_EMBEDDER": "hashing"})
    assert searched.returncode == 0, searched.stderr
    hits = json.loads(searched.stdout)
    assert "Ines" in hits[0]["content"] and hits[0]["score"] > 0

    # A user-scoped key sees only its user.
    key = runner.invoke(yak, ["keys", "create", "--user", "alice", "--remote", server.url]).stdout.strip()
    mine = _ok(remote("memory", "list", "--json", key=key))
    assert [m["user_id"] for m in mine["items"]] == ["alice"]
    refused = remote("memory", "show", bob["id"], key=key)
    assert refused.exit_code == 1 and "Marta" not in refused.stdout + refused.stderr
    assert remote("memory", "search", "sister", "--user", "bob", key=key).exit_code == 1

    # Forget by id leaves no row of that memory in any table but the audit log's ids.
    forgot = _ok(remote("forget", f"/forget {bob['id']}", "--user", "bob", "--json"))
    assert forgot["deleted_memory_ids"] == [bob["id"]]
    with database.connection() as conn:
        assert rows_mentioning(conn, bob["id"], skip=("audit_log",)) == {}
        assert rows_mentioning(conn, "Marta") == {}

    metrics = _ok(remote("metrics", "--json"))
    assert len(metrics) == 15  # DESIGN §6's ten, the memory proxy's three, the MCP server's one, issue 35's redactions
    for family in ("yak_requests", "yak_distillations_created", "yak_memories_deleted", "yak_recall_latency_ms"):
        assert any(s["value"] > 0 for s in metrics[family]["samples"]), family
    assert _ok(remote("health", "--json"))["status"] == "ok"

    wrong = runner.invoke(yak, ["memory", "list", "--remote", server.url, "--api-key", "yak_wrong"])
    assert wrong.exit_code == 1 and wrong.stderr == "error: invalid or revoked API key\n"
    unreachable = runner.invoke(yak, ["memory", "list", "--remote", f"http://127.0.0.1:{free_port()}"])
    assert unreachable.exit_code == 1 and unreachable.stderr.startswith("error: cannot reach")


def test_the_cli_uses_the_server_yak_serve_recorded_and_falls_back_when_it_is_gone(
        db_url: str, tmp_path: Path) -> None:
    """No flags: the console script finds the running server through ``$YAK_HOME/server.json``.

    Proof that the server answered and not an in-process app: the command's own database URL
    points nowhere, which in-process would fail.
    """
    home = tmp_path / "home"
    env = {**os.environ, "YAK_DATABASE_URL": db_url, "YAK_EMBEDDER": "hashing", "YAK_HOME": str(home)}
    process, url, _ = start_serve(env, tmp_path)
    nowhere = {**env, "YAK_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}
    try:
        record = json.loads((home / "server.json").read_text())
        assert record == {"url": url, "pid": process.pid}
        added = subprocess.run([str(YAK), "memory", "add", "User: I keep bees.\nAssistant: Sweet.", "--user", "ana",
                                "--json"], env=nowhere, capture_output=True, text=True, timeout=60)
        assert added.returncode == 0 and added.stderr == "", added.stderr
        listed = subprocess.run([str(YAK), "memory", "list", "--user", "ana", "--json"], env=nowhere,
                                capture_output=True, text=True, timeout=60)
        assert [m["id"] for m in json.loads(listed.stdout)["items"]] == [json.loads(added.stdout)["id"]]
    finally:
        stop_serve(process)
    assert not (home / "server.json").exists()  # a stopped server removes its record

    # A record left by a server that died without removing it: said on stderr, then in-process.
    (home / "server.json").write_text(json.dumps({"url": url, "pid": os.getpid()}))
    fallback = subprocess.run([str(YAK), "memory", "list", "--user", "ana", "--json"], env=env,
                              capture_output=True, text=True, timeout=120)
    assert fallback.returncode == 0, fallback.stderr
    assert fallback.stderr == f"note: no Yak server answers at {url}; running this command in-process\n"
    assert len(json.loads(fallback.stdout)["items"]) == 1
    # YAK_API_URL names a server too; one that is not there is a note, not an error.
    (home / "server.json").unlink()
    configured = subprocess.run([str(YAK), "memory", "list", "--user", "ana", "--json"],
                                env={**env, "YAK_API_URL": url}, capture_output=True, text=True, timeout=120)
    assert configured.returncode == 0 and "no Yak server answers at" in configured.stderr


def test_the_cli_uses_yak_admin_api_key_set_in_the_same_shell_as_the_server(db_url: str, tmp_path: Path) -> None:
    """``YAK_ADMIN_API_KEY`` exported before ``yak serve``: the server writes no key file, and the CLI
    in the same shell sends that key (it used to send none: "missing X-API-Key header")."""
    home = tmp_path / "home"
    key = "admin-key-from-the-shell-" + "x" * 24
    env = {**os.environ, "YAK_DATABASE_URL": db_url, "YAK_EMBEDDER": "hashing", "YAK_HOME": str(home),
           "YAK_ADMIN_API_KEY": key}
    process, _, _ = start_serve(env, tmp_path)
    # Its own database URL points nowhere: only the server can answer.
    nowhere = {**env, "YAK_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}
    try:
        assert not (home / "admin-api-key").exists()
        added = subprocess.run([str(YAK), "memory", "add", "I keep bees.", "--user", "ana", "--json"], env=nowhere,
                               capture_output=True, text=True, timeout=60)
        assert added.returncode == 0 and added.stderr == "", added.stderr
        # Another key in the shell is refused by the server: the key sent is the one set, not any.
        wrong = subprocess.run([str(YAK), "memory", "list", "--user", "ana", "--json"],
                               env={**nowhere, "YAK_ADMIN_API_KEY": "not-the-servers-key-" + "y" * 24},
                               capture_output=True, text=True, timeout=60)
        assert wrong.returncode != 0 and "key" in wrong.stderr.lower(), wrong.stderr
    finally:
        stop_serve(process)
