"""The README's API examples, run as written against a real ``yak serve`` holding the demo data.

The block is taken from README.md itself, so the README cannot drift from what works: the
demo user that ``examples/drop/`` creates, a query that recalls something, and a turn whose
``recalled_ids`` come from that recall (no placeholder to paste). Only the port differs (a
free one instead of 8000). The server uses the real default embedder, all-MiniLM-L6-v2: what
a query recalls depends on it, and the README promises a first try that finds something.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx

from yak_pipeline.embeddings.local import LocalMiniLMEmbedder
from yak_pipeline.llm import RulesProvider
from yak_pipeline.ingestion.claim import claim_drop_files
from yak_pipeline.services.distill import DistillJob, distill_memories
from yak_pipeline.store.database import Database
from yak_pipeline_tests.reliability_helpers import free_port

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def readme_api_example() -> str:
    """The bash block of the README that starts with reading the admin key."""
    text = (PROJECT_ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)
    matches = [b for b in blocks if b.startswith("KEY=$(cat .yak/admin-api-key)")]
    assert len(matches) == 1, "the README's API example block is missing"
    return matches[0]


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


def test_the_readme_api_examples_run_as_written(db_url: str, database: Database, tmp_path: Path) -> None:
    _seed_demo(database, tmp_path)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("YAK_")}
    # PYTHONPATH: this checkout's code, whatever the virtualenv's editable install points at.
    env.update(YAK_DATABASE_URL=db_url, YAK_EMBEDDER="local", YAK_HOME=str(tmp_path / ".yak"),
               PYTHONPATH=str(PROJECT_ROOT))
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen([sys.executable, "-m", "yak_pipeline.cli.main", "serve", "--port", str(port)],
                              cwd=PROJECT_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / ".yak" / "admin-api-key").exists() or not _healthy(port):
            assert server.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)
        script = readme_api_example().replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        done = subprocess.run(["bash", "-e", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    assert done.returncode == 0, done.stderr
    decoder = json.JSONDecoder()
    context, end = decoder.raw_decode(done.stdout)
    turn, _ = decoder.raw_decode(done.stdout[end:].lstrip())
    # The recall finds the demo user's Kyoto memories ...
    assert context["recalled_ids"], context
    assert "Kyoto" in context["block"] and context.get("note") is None
    # ... and the turn, posted as written, is accepted with exactly those ids.
    assert set(turn) >= {"turn_id", "memory_id", "queued"}, turn
    assert turn["queued"] is True and turn["new_user"] is False
    with database.connection() as conn:
        recalled = conn.execute("SELECT recalled_ids FROM turns WHERE id = %s", (turn["turn_id"],)).fetchone()[0]
    assert sorted(map(str, recalled)) == sorted(context["recalled_ids"])


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
