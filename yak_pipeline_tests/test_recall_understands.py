"""Recall that understands, through a real ``yak serve`` with the default local embedder.

The issue's check, as a user would meet it: a preference said in one set of words is found by a
question in others, and a question about something never said gets an empty memory block (not
the least-bad memories). The server runs as a subprocess on 127.0.0.1 with the packaged
all-MiniLM-L6-v2 (offline) and its shipped relevance model, on a database of its own.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from yak_pipeline.core.memory_block import BLOCK_PREAMBLE
from yak_pipeline.embeddings.local import LocalMiniLMEmbedder
from yak_pipeline.llm import RulesProvider
from yak_pipeline.services.distill import DistillJob, distill_memories
from yak_pipeline.services.exchange_embeddings import embed_pending_exchanges
from yak_pipeline.store.database import Database
from yak_pipeline_tests.conftest import create_database, drop_database
from yak_pipeline_tests.test_cli_serve import STARTUP_SECONDS, start_serve, stop_serve

# A person's history: the preference under test among other facts, so that "best of the user's
# memories" is not trivially the only one.
HISTORY = [
    ("I prefer strong black coffee over tea.", "Noted, black coffee it is."),
    ("I work as a pediatric nurse at the city hospital.", "That sounds demanding and rewarding."),
    ("We finally moved into a flat near the river in Porto.", "Congratulations on the new place!"),
    ("I've been learning to play the cello on weekends.", "That's a lovely instrument."),
    ("My sister Ines is visiting from Lisbon next week.", "Enjoy the time together."),
    ("I'm training for a half marathon in the spring.", "Good luck with the training."),
]


@pytest.fixture
def semantic_server(pg_server_url: str, tmp_path: Path) -> Iterator[tuple[str, dict[str, str], Database]]:
    """``yak serve`` with the local embedder on a new database; yields (url, admin headers, pool)."""
    name = f"yak_test_semantic_{uuid.uuid4().hex[:10]}"
    db_url = create_database(pg_server_url, name)
    key = "yak_test_admin_semantic"
    env = {**os.environ, "YAK_DATABASE_URL": db_url, "YAK_EMBEDDER": "local", "YAK_HOME": str(tmp_path / "home"),
           "YAK_ADMIN_API_KEY": key}
    database: Database | None = None
    process = None
    try:
        # The server loads the embedder before it answers.
        process, url, _ = start_serve(env, tmp_path, startup_seconds=STARTUP_SECONDS * 2)
        database = Database(db_url, max_size=4).open()
        yield url, {"X-API-Key": key}, database
    finally:
        if database is not None:
            database.close()
        if process is not None:
            stop_serve(process)
        drop_database(pg_server_url, name)


def _remember_history(url: str, headers: dict[str, str], database: Database) -> dict[str, str]:
    """Post :data:`HISTORY` as Maya's exchanges, distil and embed them; the distillation id of each exchange."""
    ids = []
    for user, assistant in HISTORY:
        response = httpx.post(f"{url}/api/memories/", headers=headers, timeout=30, json={
            "user_id": "maya", "content": f"User: {user}\nAssistant: {assistant}"})
        assert response.status_code in (200, 201), response.text
        ids.append(response.json()["id"])
    embedder = LocalMiniLMEmbedder()
    report = distill_memories(DistillJob(database, llm=RulesProvider(), embedder=embedder, prompt_version="v1"), ids)
    assert report.rows_out == len(HISTORY)
    embed_pending_exchanges(database, embedder, user_id="maya")
    with database.connection() as conn:
        by_memory = {str(m): str(d) for d, m in conn.execute("SELECT id, memory_id FROM distillations").fetchall()}
    return {user: by_memory[memory_id] for (user, _), memory_id in zip(HISTORY, ids)}


def test_a_paraphrase_is_recalled_and_a_never_said_fact_gives_an_empty_block(semantic_server) -> None:  # noqa: ANN001
    url, headers, database = semantic_server
    _remember_history(url, headers, database)

    drink = httpx.post(f"{url}/api/context", headers=headers, timeout=30,
                       json={"user_id": "maya", "query": "what do I like to drink?"})
    assert drink.status_code == 200, drink.text
    # Recalled, not only carried by the profile ("I prefer strong black coffee over tea" is a preference).
    recalled_part = drink.json()["block"].split(BLOCK_PREAMBLE, 1)[1]
    assert "black coffee" in recalled_part and drink.json()["recalled_ids"]
    assert drink.json()["block"].startswith("<memories>")

    search = httpx.post(f"{url}/api/distillations/search", headers=headers, timeout=30,
                        json={"user_id": "maya", "query": "what do I like to drink?", "explain": True})
    top = search.json()[0]
    assert "coffee" in top["content"] and top["relevance"] >= 0.7
    assert set(top["explain"]) >= {"relevance", "standing", "answerability", "decay", "warmth_factor", "gravity", "legs"}

    dog = httpx.post(f"{url}/api/context", headers=headers, timeout=30,
                     json={"user_id": "maya", "query": "what is my dog called?"})
    assert dog.status_code == 200, dog.text
    # Nothing recalled: the block carries only the profile (the preference), no recalled part.
    assert dog.json()["recalled_ids"] == [] and BLOCK_PREAMBLE not in dog.json()["block"]
    assert len(dog.json()["profile_ids"]) == 1 and "black coffee" in dog.json()["block"]


def test_offline_warmth_rewards_a_used_memory_and_cools_an_unused_one(semantic_server) -> None:  # noqa: ANN001
    """Without an LLM the warmth judge is recall's relevance model on its even-odds scale: the
    rules provider's word overlap only ever lowered warmth (a memory the answer used scored 0.67)."""
    url, headers, database = semantic_server
    distillation_of = _remember_history(url, headers, database)
    coffee, nurse = distillation_of[HISTORY[0][0]], distillation_of[HISTORY[1][0]]
    turn = "User: What should I order at the cafe?\nAssistant: A strong black coffee, since you prefer that to tea."

    used = httpx.post(f"{url}/api/warmth/evaluate", headers=headers, timeout=30,
                      json={"memory_id": coffee, "context": turn}).json()
    unused = httpx.post(f"{url}/api/warmth/evaluate", headers=headers, timeout=30,
                        json={"memory_id": nurse, "context": turn}).json()
    assert used["relevance_score"] > 0.7 and used["warmth_change"] == pytest.approx(0.1)
    assert unused["relevance_score"] < 0.3 and unused["warmth_change"] == pytest.approx(-0.2)



def test_a_question_about_the_present_gets_the_latest_statement_first(semantic_server) -> None:  # noqa: ANN001
    """A knowledge update: the old home was said months before the move; "now" asks for the current one."""
    url, headers, database = semantic_server
    old = httpx.post(f"{url}/api/memories/", headers=headers, timeout=30, json={
        "user_id": "maya", "occurred_at": "2025-01-10T09:00:00Z",
        "content": "User: I live in a small flat in Lisbon, in the Alfama district.\nAssistant: A lovely old quarter."})
    assert old.status_code in (200, 201), old.text
    distill_memories(DistillJob(database, llm=RulesProvider(), embedder=LocalMiniLMEmbedder(), prompt_version="v1"),
                     [old.json()["id"]])
    _remember_history(url, headers, database)  # ...including the move to Porto, said today

    now = httpx.post(f"{url}/api/distillations/search", headers=headers, timeout=30,
                     json={"user_id": "maya", "query": "where do I live now?", "explain": True}).json()
    texts = [h["content"] for h in now]
    porto = next(i for i, t in enumerate(texts) if "Porto" in t)
    lisbon_at = next((i for i, t in enumerate(texts) if "Lisbon" in t and "Alfama" in t), None)
    assert lisbon_at is not None, texts  # both answer where Maya lives...
    assert porto < lisbon_at and now[porto]["explain"]["newest_first"]  # ...the latest first
    # Without "now" the order is the score's: nothing is placed by recency.
    before = httpx.post(f"{url}/api/distillations/search", headers=headers, timeout=30,
                        json={"user_id": "maya", "query": "where do I live?", "explain": True}).json()
    assert not any(h["explain"]["newest_first"] for h in before)
