"""``yak context``: the console script against a real ``yak serve``, printing the block ``/api/context`` builds."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx

from yak_pipeline.embeddings.hashing import HashingEmbedder
from yak_pipeline.llm import RulesProvider
from yak_pipeline.services.distill import DistillJob, distill_memories
from yak_pipeline.store.database import Database
from yak_pipeline_tests.test_cli_serve import YAK, start_serve, stop_serve

QUESTION = "What is my sister called? Ines"


def _yak(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(YAK), *args], env=env, capture_output=True, text=True, timeout=120)


def test_yak_context_prints_the_block_the_api_gives_a_prompt(db_url: str, database: Database, tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "YAK_DATABASE_URL": db_url, "YAK_EMBEDDER": "hashing", "YAK_HOME": str(home)}
    process, url, _ = start_serve(env, tmp_path)
    # The CLI finds the server through $YAK_HOME/server.json; a database it cannot reach proves that
    # the server answered, not an app in this process.
    cli_env = {**env, "YAK_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"}
    try:
        added = [json.loads(_yak(cli_env, "memory", "add", text, "--user", "alice", "--json").stdout)["id"]
                 for text in ("User: My sister is called Ines.\nAssistant: Nice name.",
                              "User: I play the cello on Sundays.\nAssistant: Lovely.")]
        distill_memories(DistillJob(database, llm=RulesProvider(), embedder=HashingEmbedder(384),
                                    prompt_version="v1"), added)
        key = (home / "admin-api-key").read_text().strip()
        expected = httpx.post(f"{url}/api/context", headers={"X-API-Key": key}, timeout=30,
                              json={"query": QUESTION, "user_id": "alice", "threshold": 0.1, "limit": 1}).json()
        assert "Ines" in expected["block"] and len(expected["recalled_ids"]) == 1

        shown = _yak(cli_env, "context", QUESTION, "--user", "alice", "--threshold", "0.1", "--limit", "1")
        assert shown.returncode == 0 and shown.stderr == "", shown.stderr
        assert shown.stdout.rstrip("\n") == expected["block"].rstrip("\n")
        assert shown.stdout.startswith("<memories") and "cello" not in shown.stdout

        as_json = json.loads(_yak(cli_env, "context", QUESTION, "--user", "alice", "--threshold", "0.1",
                                  "--limit", "1", "--json").stdout)
        assert as_json["block"] == expected["block"] and as_json["recalled_ids"] == expected["recalled_ids"]

        # An empty block is an answer (exit 0, nothing on stdout) with its reason on stderr.
        nobody = _yak(cli_env, "context", QUESTION, "--user", "nobody")
        assert nobody.returncode == 0 and nobody.stdout == ""
        assert nobody.stderr == "note: user 'nobody' has no memories; the block is empty\n"
        strict = _yak(cli_env, "context", "train timetables to Utrecht", "--user", "alice", "--threshold", "1")
        assert strict.returncode == 0 and strict.stdout == ""
        assert strict.stderr == "note: no memory is relevant enough (threshold 1.00); the block is empty\n"

        # Bad input: one line, non-zero, no traceback.
        bad = _yak(cli_env, "context", QUESTION, "--user", "a|b")
        assert bad.returncode == 1 and bad.stderr.startswith("error: ") and bad.stderr.count("\n") == 1, bad.stderr
        usage = _yak(cli_env, "context", QUESTION, "--user", "alice", "--threshold", "2")
        assert usage.returncode == 2 and "Traceback" not in usage.stderr
    finally:
        stop_serve(process)
