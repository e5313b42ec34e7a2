"""The README's shell blocks, run as written against a real ``yak serve`` holding the demo data.

Every ```` ```bash ```` block of README.md is run, in the README's order, in a folder laid out as
the project folder after ``make setup`` and a first ``make run``: ``.venv`` (this test's virtual
environment), ``dagster.yaml``, the ``.env`` the Makefile writes, and ``.yak``, Yak's home (no
``YAK_HOME`` is set), with ``yak serve`` running there on the demo user that ``examples/drop/``
creates. The blocks are taken from README.md itself, so the README cannot drift from what works:
only the API's port differs (a free one instead of 8000). A block is left out only when it needs
a network, a program Yak does not install, or runs until Ctrl-C; :data:`NOT_RUN` names each and
why, and every one of its entries must still match a block. The server uses the real default
embedder, all-MiniLM-L6-v2: what a query recalls depends on it, and the README promises a first
try that finds something.

The database is the test's own (``YAK_DATABASE_URL``), not an embedded server in ``.yak``: the
test suite runs on one server per process (or ``YAK_TEST_DATABASE_URL``); the embedded server
has tests of its own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from yak_pipeline.embeddings.local import LocalMiniLMEmbedder
from yak_pipeline.ingestion.claim import claim_drop_files
from yak_pipeline.llm import RulesProvider
from yak_pipeline.services.distill import DistillJob, distill_memories
from yak_pipeline.store.database import Database, ensure_dagster_database
from yak_pipeline_tests.conftest import drop_database
from yak_pipeline_tests.reliability_helpers import free_port

PROJECT_ROOT = Path(__file__).resolve().parents[1]

# The blocks not run, by how they start, and why.
NOT_RUN = {
    "make run": "`make run` runs Yak until Ctrl-C and `make test` the whole suite, this test included "
                "(`make setup` may download packages)",
    "export DAGSTER_HOME=": "submits a backfill to the Dagster instance of a running `yak up`, whose daemon "
                           "runs it (the backfill itself: test_pipeline_*)",
    "export YAK_UPSTREAM_BASE_URL=": "forwards chats to a model server, and `yak proxy` runs until Ctrl-C "
                                     "(test_proxy.py runs it against a scripted model server)",
    ".venv/bin/yak mcp --http": "needs Claude Code (`claude`), a client Yak does not install, signed in "
                                "(the MCP server: test_mcp.py)",
    ".venv/bin/yak eval locomo": "needs LoCoMo data, downloaded: no data ships with Yak "
                                 "(the evaluation: test_eval_locomo.py)",
    ".venv/bin/yak proxy                                       # also serves /v1/messages":
        "runs `yak proxy` until Ctrl-C for Claude Code, a client Yak does not install, which talks to "
        "Anthropic's API (the Messages path: test_proxy_anthropic.py, with the anthropic SDK)",
}


@dataclass(frozen=True)
class Block:
    """One shell block of the README and what running it printed."""

    script: str
    stdout: str = ""
    stderr: str = ""


def readme_shell_blocks() -> list[str]:
    """Every bash block of README.md, in order, with any indentation of a list item removed."""
    text = (PROJECT_ROOT / "README.md").read_text()
    blocks = re.findall(r"^( *)```bash\n(.*?)^ *```", text, flags=re.DOTALL | re.MULTILINE)
    return [re.sub(rf"(?m)^{indent}", "", body) for indent, body in blocks]


def _not_run_reason(script: str) -> str | None:
    return next((why for start, why in NOT_RUN.items() if script.startswith(start)), None)


def _seed_demo(database: Database, folder: Path) -> None:
    """What the first `make run` does with examples/drop/: claim the files, distil the exchanges."""
    drop = folder / "drop"
    shutil.copytree(PROJECT_ROOT / "examples" / "drop", drop)
    report = claim_drop_files(database, drop, min_age_seconds=0)
    assert report.files and not any(f.error for f in report.files)
    with database.connection() as conn:
        ids = [str(r[0]) for r in conn.execute("SELECT id FROM memories WHERE user_id = 'demo'").fetchall()]
    job = DistillJob(database, llm=RulesProvider(), embedder=LocalMiniLMEmbedder(), prompt_version="v1")
    distill_memories(job, ids)


def _project_folder(tmp_path: Path) -> Path:
    """The project folder as `make setup` leaves it, for what the blocks read: .venv, dagster.yaml, .env."""
    folder = tmp_path / "yak"
    folder.mkdir()
    (folder / ".venv").symlink_to(Path(sys.executable).parent.parent)
    shutil.copy(PROJECT_ROOT / "dagster.yaml", folder / "dagster.yaml")
    made = subprocess.run(["make", "-s", "-C", str(folder), "-f", str(PROJECT_ROOT / "Makefile"), ".env"],
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    return folder


def test_the_readme_shell_blocks_run_as_written(db_url: str, database: Database, tmp_path: Path) -> None:
    blocks = readme_shell_blocks()
    # Every reason for leaving a block out still names a block of the README.
    for start in NOT_RUN:
        assert sum(b.startswith(start) for b in blocks) == 1, f"NOT_RUN names no single README block: {start!r}"

    _seed_demo(database, tmp_path)
    folder = _project_folder(tmp_path)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("YAK_", "DAGSTER_"))}
    # PYTHONPATH: this checkout's code, whatever the virtualenv's editable install points at.
    env.update(YAK_DATABASE_URL=db_url, YAK_EMBEDDER="local", PYTHONPATH=str(PROJECT_ROOT))
    # `yak up` makes Dagster's database on Yak's server; this test's server may not have one yet.
    made_dagster_database = ensure_dagster_database(db_url)
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen([sys.executable, "-m", "yak_pipeline.cli.main", "serve", "--port", str(port)],
                              cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
    ran: list[Block] = []
    try:
        deadline = time.monotonic() + 60
        while not (folder / ".yak" / "admin-api-key").exists() or not _healthy(port):
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)
        for block in blocks:
            if _not_run_reason(block):
                continue
            script = block.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
            done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=folder, env=env,
                                  capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, f"README block failed:\n{block}\n--- stderr:\n{done.stderr[-3000:]}"
            ran.append(Block(block, done.stdout, done.stderr))
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
        if made_dagster_database:
            drop_database(db_url, "dagster")

    def ran_block(start: str) -> Block:
        [found] = [b for b in ran if b.script.startswith(start)]
        return found

    assert len(ran) + len(NOT_RUN) == len(blocks)

    # Plain dagster commands: the exported URL wins over the .env (whose ./.yak has no server).
    assert "Validation successful" in (lambda b: b.stdout + b.stderr)(ran_block("export YAK_DAGSTER_PG_URL="))

    # The API example: the recall finds the demo user's Kyoto memories ...
    api = ran_block("KEY=$(.venv/bin/yak keys show-admin)")
    decoder = json.JSONDecoder()
    context, end = decoder.raw_decode(api.stdout)
    turn, _ = decoder.raw_decode(api.stdout[end:].lstrip())
    assert context["recalled_ids"], context
    assert "Kyoto" in context["block"] and context.get("note") is None
    # ... and the turn, posted as written, is accepted with exactly those ids.
    assert set(turn) >= {"turn_id", "memory_id", "queued"}, turn
    assert turn["queued"] is True and turn["new_user"] is False
    with database.connection() as conn:
        recalled = conn.execute("SELECT recalled_ids FROM turns WHERE id = %s", (turn["turn_id"],)).fetchone()[0]
    assert sorted(map(str, recalled)) == sorted(context["recalled_ids"])

    # The CLI's memory add takes a plain sentence and an exchange on stdin.
    added = ran_block(".venv/bin/yak memory add")
    assert added.stdout.count("stored memory ") == 2 and "Utrecht" in added.stdout
    with database.connection() as conn:
        contents = {r[0] for r in conn.execute("SELECT content FROM memories WHERE user_id = 'demo' "
                                               "AND content LIKE '%Utrecht%'").fetchall()}
    assert contents == {"I moved to Utrecht in May.", "User: Any tips for Utrecht?\nAssistant: Rent a bike."}

    # yak context prints the block a prompt gets (the turn posted since is recalled too, as the user's words).
    recall = ran_block(".venv/bin/yak context")
    assert recall.stdout.startswith("<memories") and "Kyoto" in recall.stdout.split("</memories>")[0]

    database_block = ran_block(".venv/bin/yak db url")
    assert "database is up to date" in database_block.stdout
    assert "YAK_DATABASE_URL is set: Yak does not manage that server" in database_block.stdout  # db stop


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
