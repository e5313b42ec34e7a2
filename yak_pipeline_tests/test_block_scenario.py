"""The block a new user gets (issue 33's scenario), through a real ``yak serve`` and ``yak process``.

One user tells Yak eight facts, then, weeks later, "I no longer eat vegetarian, I started eating
fish". The exchanges go in through ``POST /api/memories``, ``yak process`` distils them (rules
distiller, conflict check), and ``POST /api/context`` builds the block as a prompt would get it,
on the offline defaults: the real default embedder (all-MiniLM-L6-v2, what the shipped relevance
model is fitted for), threshold 0.7, the odds gap and the token budget. The block must hold only
what answers: the current diet and not the replaced one, the drink and at most one more line, and
nothing at all for a question about something never said.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from yak_pipeline_tests.api_fixtures import ADMIN_KEY
from yak_pipeline_tests.reliability_helpers import yak_env, yak_serve

PROJECT_ROOT = Path(__file__).resolve().parents[1]
USER = "sam"
FACTS = ("I drink coffee every morning, black.", "I'm vegetarian.", "My sister lives in Lisbon.",
         "I work as a nurse.", "Radiohead is my favourite band.", "I go running three times a week.",
         "I have a peanut allergy.", "I write code in the Helix editor.")
CHANGE = "I no longer eat vegetarian, I started eating fish."

# Tens of seconds: the embedding model loads in two processes, and `yak process` starts Dagster.
pytestmark = pytest.mark.slow


def _context(client: httpx.Client, query: str) -> list[str]:
    """The block's memory lines for ``query`` (the lines that start with "- ")."""
    response = client.post("/api/context", json={"user_id": USER, "query": query})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["recall_error"] is None, body
    lines = [line for line in body["block"].splitlines() if line.startswith("- ")]
    assert len(lines) == len(body["recalled_ids"]), body
    return lines


def test_the_block_holds_only_what_answers_with_the_current_fact(db_url: str, tmp_path: Path) -> None:
    env = yak_env(db_url, tmp_path / "home", YAK_EMBEDDER="local", YAK_ADMIN_API_KEY=ADMIN_KEY,
                  PYTHONPATH=str(PROJECT_ROOT))
    start = datetime.now(UTC) - timedelta(days=40)
    with yak_serve(env, tmp_path) as server, httpx.Client(
            base_url=server.url, headers={"X-API-Key": ADMIN_KEY}, timeout=60) as client:
        # The eight facts an hour apart on one day, the change of diet a month later.
        said = [(fact, start + timedelta(hours=i)) for i, fact in enumerate(FACTS)]
        said.append((CHANGE, start + timedelta(days=30)))
        for text, when in said:
            response = client.post("/api/memories", json={"user_id": USER, "occurred_at": when.isoformat(),
                                                          "content": f"User: {text}\nAssistant: Noted."})
            assert response.status_code == 201, response.text
        processed = subprocess.run([sys.executable, "-m", "yak_pipeline.cli.main", "process", "--json"], env=env,
                                   cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
        assert processed.returncode == 0, processed.stderr[-3000:]

        cook = _context(client, "what should I cook tonight?")
        assert any("fish" in line for line in cook), cook
        assert not any("vegetarian" in line and "fish" not in line for line in cook), cook

        drink = _context(client, "what do I like to drink?")
        assert 1 <= len(drink) <= 2 and "coffee" in drink[0], drink

        editor = _context(client, "which editor do I use?")
        assert editor and "Helix" in editor[0] and len(editor) <= 2, editor

        # Nothing was said about a dog: nothing is injected.
        assert _context(client, "what is my dog's name?") == []
        # Each line says what it is and when it was said, in words.
        assert drink[0].startswith("- (distilled memory, said on "), drink
