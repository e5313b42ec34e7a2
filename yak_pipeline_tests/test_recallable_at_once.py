"""Recallable at once (issue 32): what the user said is found by recall as soon as it is stored,
with no pipeline running (no Dagster, no ``yak process``), as the user's own words (``kind`` raw).

Each test goes through real processes on the test's database (hashing embedder, rules LLM):
``yak mcp --user`` over stdio driven by the ``mcp`` SDK's client, ``yak proxy`` driven by the real
``openai`` client against the loopback OpenAI-protocol upstream, ``yak import`` of a generated
1,000-exchange drop file, and the HTTP API under uvicorn. "At once" is measured with
``time.monotonic``: one search (or one proxied chat) right after the write, which must both run
and find the fact within 1 s of the write returning (or, for the proxy, of the turn being seen
stored). Nothing retries a search until it succeeds.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from yak_loopback.openai_server import FakeOpenAIServer
from yak_pipeline.api.app import create_app
from yak_pipeline.core.memory_block import BLOCK_OPEN
from yak_pipeline.embeddings.hashing import HashingEmbedder
from yak_pipeline.services.recall import recall_params
from yak_pipeline.settings import Settings
from yak_pipeline.store.api_keys import create_api_key
from yak_pipeline.store.bm25 import bm25_search
from yak_pipeline.store.database import Database
from yak_pipeline.store.recall import recall_candidates
from yak_pipeline.store.vector_legs import vector_search
from yak_pipeline_tests.api_fixtures import ADMIN_KEY, Seeded, api_settings, seeded, serve_in_thread  # noqa: F401
from yak_pipeline_tests.pipeline_helpers import fetch_all, fetch_one
from yak_pipeline_tests.reliability_helpers import yak_env, yak_serve

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM_KEY = "sk-upstream-secret-recall-at-once"
AT_ONCE_SECONDS = 1.0
EMBEDDER = HashingEmbedder(384)


def _yak_cmd(*args: str) -> list[str]:
    """A ``yak`` command line; ``python -m`` from the project folder runs this checkout's code."""
    return [sys.executable, "-m", "yak_pipeline.cli.main", *args]


def _distillations_of(database: Database, memory_id: str) -> int:
    """How many distillations (of any status) were made of ``memory_id``."""
    return fetch_one(database, "SELECT count(*) FROM distillations WHERE memory_id = %s", (memory_id,))[0]


# --- 1. yak mcp alone ------------------------------------------------------------------------------


DENTIST = "My dentist is Dr. Okafor on Keizersgracht."
DENTIST_QUESTION = "who is my dentist?"


async def _tool(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structured result; fails the test on a tool error."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    return result.structured_content


def test_mcp_alone_a_saved_fact_is_searchable_as_the_users_words_within_a_second(
        db_url: str, database: Database, seeded: Seeded, tmp_path: Path) -> None:  # noqa: F811
    """``yak mcp --user alice`` over stdio, nothing else running: before ``memory_save`` the question
    finds nothing about a dentist; one ``memory_search`` right after the save returns finds the
    fact as a raw hit (the exchange's memory id, the user's words) within 1 s of the save's return,
    with the exchange's vectors already stored and no distillation made of it (nothing distilled)."""
    env = yak_env(db_url, tmp_path / "home")
    command, *args = _yak_cmd("mcp", "--user", "alice")
    params = StdioServerParameters(command=command, args=args, env=env, cwd=str(ROOT))
    timings: dict[str, float] = {}

    async def main() -> tuple[dict, dict, dict]:
        async with Client(params, read_timeout_seconds=60) as alice:
            started = time.monotonic()
            before = await _tool(alice, "memory_search", query=DENTIST_QUESTION)
            timings["first search (cold process)"] = time.monotonic() - started
            started = time.monotonic()
            saved = await _tool(alice, "memory_save", fact=DENTIST)
            saved_at = time.monotonic()
            timings["save"] = saved_at - started
            found = await _tool(alice, "memory_search", query=DENTIST_QUESTION)
            timings["save returned -> search answered"] = time.monotonic() - saved_at
            return before, saved, found

    before, saved, found = anyio.run(main)
    print(f"\n[recall-at-once] mcp: {', '.join(f'{k} {v * 1000:.0f} ms' for k, v in timings.items())}")

    assert not [m for m in before["memories"] if "Okafor" in m["content"] or "dentist" in m["content"].lower()], before
    assert saved["stored"] is True
    memory_id = saved["memory_id"]
    hits = [m for m in found["memories"] if m["id"] == memory_id]
    assert hits, found
    (hit,) = hits
    assert hit["kind"] == "raw" and hit["memory_id"] == memory_id and hit["content"] == DENTIST
    # Found through the default gate (threshold 0.7). Where it ranks among alice's seeded
    # distillations is the tests' hashing embedder's business (it reads words, not meaning).
    assert hit["relevance"] >= 0.7
    assert seeded.bob.secret not in json.dumps(found)
    assert timings["save returned -> search answered"] < AT_ONCE_SECONDS, timings

    # Nothing ran: no distillation of it, still pending; yet its vectors were made by the save.
    assert _distillations_of(database, memory_id) == 0
    assert fetch_one(database, """SELECT status, embedding IS NOT NULL, embedding_model,
                                         context_embedding IS NOT NULL FROM memories WHERE id = %s""",
                     (memory_id,)) == ("pending", True, EMBEDDER.model_name, True)


# --- 2. the proxy alone ----------------------------------------------------------------------------


LOCKER = "My locker at the climbing gym is number 42."
LOCKER_QUESTION = "Which number is my locker at the climbing gym?"


@pytest.fixture
def yak_proxy(db_url: str, upstream: FakeOpenAIServer, tmp_path: Path) -> Iterator[str]:
    """A real ``yak proxy`` subprocess (default recall threshold) on a free port; yields its URL."""
    env = yak_env(db_url, tmp_path / "home", YAK_UPSTREAM_BASE_URL=upstream.base_url,
                  YAK_UPSTREAM_API_KEY=UPSTREAM_KEY, YAK_ADMIN_API_KEY=ADMIN_KEY)
    with yak_serve(env, tmp_path, command="proxy") as server:
        yield server.url


def test_proxy_alone_a_fact_said_in_one_chat_is_in_the_next_chats_block_within_a_second(
        yak_proxy: str, upstream: FakeOpenAIServer, seeded: Seeded, database: Database) -> None:  # noqa: F811
    """``yak proxy`` alone (a real subprocess, default recall threshold): alice says a fact in one
    proxied chat; as soon as its turn is seen stored in the database, a second proxied chat asks
    about it, and the upstream's request holds the fact in its ``<memories>`` block as the user's
    own words (alice's older locker code alone would not do), all within 1 s of the turn's row being
    seen (the turn writer's vectors included: the second chat is sent once they are there). No
    pipeline runs: the exchange stays pending with no distillation."""
    alice = openai.OpenAI(base_url=f"{yak_proxy}/v1", api_key=seeded.alice_key, max_retries=0, timeout=15)
    first = alice.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": LOCKER}])
    assert first.choices[0].message.content == f"You said: {LOCKER}"
    assert LOCKER not in json.dumps(upstream.chat_requests[-1].body["messages"][:-1])  # not known before

    # The turn writer stores the turn after the answer has gone out, then gives the exchange its
    # vectors (services.exchange_embeddings.embed_exchanges_now): wait until it has done both (what proxy_fixtures'
    # `settle` waits for in-thread). The clock starts when the exchange's row is first seen.
    content = f"User: {LOCKER}\nAssistant: You said: {LOCKER}"
    deadline = time.monotonic() + 15
    while (row := fetch_one(database, "SELECT id::text FROM memories WHERE user_id = 'alice' AND content = %s",
                            (content,))) is None:
        assert time.monotonic() < deadline, "the proxied turn was not stored in 15 s"
        time.sleep(0.005)
    stored_at = time.monotonic()
    memory_id = row[0]
    while fetch_one(database, "SELECT embedding IS NOT NULL AND context_embedding IS NOT NULL FROM memories "
                              "WHERE id = %s", (memory_id,)) != (True,):
        assert time.monotonic() < stored_at + AT_ONCE_SECONDS, "the proxied turn got no vectors within 1 s"
        time.sleep(0.005)
    embedded = time.monotonic() - stored_at

    second = alice.chat.completions.create(model="fake-model",
                                           messages=[{"role": "user", "content": LOCKER_QUESTION}])
    elapsed = time.monotonic() - stored_at
    print(f"\n[recall-at-once] proxy: turn seen stored -> its vectors seen {embedded * 1000:.0f} ms -> next chat "
          f"answered with it in the block {elapsed * 1000:.0f} ms")
    assert second.choices[0].message.content == f"You said: {LOCKER_QUESTION}"
    messages = upstream.chat_requests[-1].body["messages"]
    assert len(messages) == 2 and messages[1] == {"role": "user", "content": LOCKER_QUESTION}
    block = messages[0]
    assert block["role"] == "system" and block["content"].startswith(BLOCK_OPEN), messages
    lines = [line for line in block["content"].splitlines() if line.startswith("- (")]
    assert any(line.startswith("- (the user's own words") and LOCKER in line for line in lines), block["content"]
    assert seeded.bob.secret not in block["content"]
    assert elapsed < AT_ONCE_SECONDS, f"{elapsed:.3f} s"

    assert _distillations_of(database, memory_id) == 0
    assert fetch_one(database, "SELECT status FROM memories WHERE id = %s", (memory_id,)) == ("pending",)


# --- 3. yak import of 1,000 exchanges ------------------------------------------------------------


PASSPORT = "My passport number is QX7719204 and it expires in March 2031."
PASSPORT_QUESTION = "What is my passport number?"
TOPICS = ["the weather in Utrecht", "a sourdough starter", "the train to Antwerp", "my tomato plants",
          "a chess opening", "the new laptop fan", "a running plan for spring", "the cat's vaccinations",
          "a book about Roman history", "the kitchen tap", "a birthday present for Ines", "learning Portuguese",
          "the electricity bill", "a podcast about jazz", "my bicycle's gears", "the heating schedule",
          "a recipe for lentil soup", "the dentist appointment reminder app", "a hike near Maastricht",
          "spreadsheet formulas"]
VERBS = ["I was thinking about", "Can you help me with", "Tell me something about", "I keep forgetting",
         "Yesterday I read about", "What do you know about", "I'm worried about", "Give me tips on"]


def _export(path: Path, *, count: int, fact_at: int) -> None:
    """A Yak drop file (.jsonl) of ``count`` exchanges over ``count`` minutes; number ``fact_at`` says PASSPORT."""
    rng = random.Random(32)
    start = datetime(2025, 6, 1, 8, 0, tzinfo=UTC)
    with path.open("w", encoding="utf-8") as handle:
        for i in range(count):
            if i == fact_at:
                user, assistant = PASSPORT, "Noted; keep a copy somewhere safe."
            else:
                user = f"{rng.choice(VERBS)} {rng.choice(TOPICS)} (note {i})."
                assistant = f"Here is a thought on that, number {i}: take it one step at a time."
            when = (start + timedelta(minutes=i)).isoformat().replace("+00:00", "Z")
            handle.write(json.dumps({"user": user, "assistant": assistant, "occurred_at": when}) + "\n")


def test_yak_import_of_1000_exchanges_is_searchable_as_raw_within_a_second_of_exiting(
        db_url: str, api_settings: Settings, database: Database, tmp_path: Path) -> None:  # noqa: F811
    """``yak import`` (a real subprocess) of a generated 1,000-exchange drop file, one exchange of
    which holds a passport number: with ``--wait`` (the vectors made before it returns, not in the
    background) it exits 0 having stored and embedded all 1,000 (no pipeline),
    and one search through the HTTP API (already serving before the import) finds the passport
    exchange as a raw hit within 1 s of the import exiting, by a question that shares few words
    with it."""
    export = tmp_path / "history.jsonl"
    _export(export, count=1000, fact_at=617)
    with database.connection() as conn:
        _, key = create_api_key(conn, user_id="maria", label="test")
    with serve_in_thread(create_app(api_settings, database=database)) as url, \
            httpx.Client(base_url=url, headers={"X-API-Key": key}, timeout=30) as api:
        # A running server: before the import maria has no memories at all.
        assert api.post("/api/distillations/search", json={"query": PASSPORT_QUESTION, "user_id": "maria"}
                        ).status_code == 404

        started = time.monotonic()
        result = subprocess.run(_yak_cmd("import", str(export), "--user", "maria", "--wait", "--json"),
                                env=yak_env(db_url, tmp_path / "home", YAK_DROP_DIR=str(tmp_path / "drop")),
                                cwd=ROOT, capture_output=True, text=True, timeout=600)
        exited = time.monotonic()
        assert result.returncode == 0, result.stderr[-3000:]
        found = api.post("/api/distillations/search", json={"query": PASSPORT_QUESTION, "user_id": "maria"})
        answered = time.monotonic() - exited
    print(f"\n[recall-at-once] import: 1,000 exchanges imported and embedded in {exited - started:.1f} s; "
          f"exit -> search answered {answered * 1000:.0f} ms")

    totals = json.loads(result.stdout)["totals"]
    assert (totals["exchanges"], totals["already_stored"], totals["embedded"]) == (1000, 0, 1000), totals
    assert found.status_code == 200, found.text
    hits = found.json()
    assert hits and hits[0]["kind"] == "raw" and hits[0]["content"] == PASSPORT, hits
    assert hits[0]["confidence"] is None and hits[0]["reply"] == "Noted; keep a copy somewhere safe."
    assert answered < AT_ONCE_SECONDS, f"{answered:.3f} s"
    # Nothing distilled: every exchange is pending, every one has both of its vectors.
    assert fetch_all(database, """SELECT status, count(*), count(embedding), count(context_embedding)
                                  FROM memories WHERE user_id = 'maria' GROUP BY status""") == [
        ("pending", 1000, 1000, 1000)]
    assert fetch_one(database, "SELECT count(*) FROM distillations")[0] == 0
    memory_id = fetch_one(database, "SELECT id::text FROM memories WHERE content LIKE %s", (f"User: {PASSPORT}%",))[0]
    assert hits[0]["id"] == hits[0]["memory_id"] == memory_id


# --- 4. forget and as_of ---------------------------------------------------------------------------


# Found by its words: a name and a street, which the text legs match.
WORDS_QUERY = "Okafor Keizersgracht"
# Found by its meaning: the hashing embedder's "meaning" is the words and word pairs a text shares
# (it is no semantic model), so the question shares "my dentist" with the fact.
MEANING_QUERY = "Who is my dentist?"
NEIGHBOUR = "User: My tooth has been aching since Sunday.\nAssistant: You should have it looked at soon."


def _legs_finding(conn, user_id: str, query: str, memory_id: str) -> set[str]:  # noqa: ANN001 - psycopg
    """Which of the exchange legs, each run on its own, return ``memory_id`` for ``query``."""
    vector = EMBEDDER.embed_query(query)
    legs = {
        "bm25 exchange": bm25_search(conn, table="memories", user_id=user_id, query=query, limit=50),
        "bm25 exchange in context": bm25_search(conn, table="memories", user_id=user_id, query=query, limit=50,
                                                context=True),
        "vector exchange": vector_search(conn, table="memories", user_id=user_id, query_embedding=vector,
                                         embedding_model=EMBEDDER.model_name, limit=50),
        "vector exchange in context": vector_search(conn, table="memories", user_id=user_id, query_embedding=vector,
                                                    embedding_model=EMBEDDER.model_name, limit=50, context=True),
    }
    return {name for name, hits in legs.items() if any(h.id == memory_id for h in hits)}


def _candidate(conn, settings: Settings, user_id: str, query: str, memory_id: str):  # noqa: ANN001, ANN202
    """The raw candidate ``recall_candidates`` proposes for ``memory_id`` and ``query``, or None."""
    candidates = recall_candidates(conn, user_id=user_id, query=query, query_embedding=EMBEDDER.embed_query(query),
                                   embedding_model=EMBEDDER.model_name, params=recall_params(settings))
    return next((c for c in candidates if c.id == memory_id), None)


def test_forget_by_a_raw_hits_id_removes_it_from_every_leg_at_once_and_as_of_before_it_finds_nothing(
        api_settings: Settings, database: Database, seeded: Seeded) -> None:  # noqa: F811
    """A fact saved through the HTTP API (``POST /api/memories``, embedded by the request) right after
    an exchange of the same conversation is found at once by a words query (the text legs propose
    it) and by a meaning query (the vector legs, with a clear cosine), as a raw hit whose id is the
    memory's; recalled ``as_of`` a moment before it was said it is not found, ``as_of`` just after it
    is. ``DELETE /api/memories/{raw hit id}`` then removes it at once: neither query's search, no
    candidate of ``recall_candidates``, no single leg (BM25 and vectors, alone and in context), and
    no longer the neighbour's context words, has it; alice's other memories are still recalled."""
    with serve_in_thread(create_app(api_settings, database=database)) as url, \
            httpx.Client(base_url=url, headers={"X-API-Key": seeded.alice_key}, timeout=30) as api:
        def search(query: str, **extra: Any) -> list[dict]:
            response = api.post("/api/distillations/search", json={"query": query, "user_id": "alice", **extra})
            assert response.status_code == 200, response.text
            return response.json()

        for query in (WORDS_QUERY, MEANING_QUERY):  # nothing of it before
            assert not [h for h in search(query) if "Okafor" in h["content"]]
        # The exchange before it in the same conversation (its context holds the fact once it is said).
        earlier = (datetime.now(UTC) - timedelta(minutes=5)).isoformat()
        neighbour = api.post("/api/memories", json={"content": NEIGHBOUR, "user_id": "alice", "occurred_at": earlier})
        assert neighbour.status_code == 201, neighbour.text
        neighbour_id = neighbour.json()["id"]

        created = api.post("/api/memories", json={"content": DENTIST, "user_id": "alice"})
        saved_at = time.monotonic()
        assert created.status_code == 201, created.text
        memory_id, said_at = created.json()["id"], datetime.fromisoformat(created.json()["occurred_at"])
        by_words = search(WORDS_QUERY)
        answered = time.monotonic() - saved_at
        by_meaning = search(MEANING_QUERY)
        print(f"\n[recall-at-once] api: save returned -> words search answered {answered * 1000:.0f} ms")
        for hits in (by_words, by_meaning):
            assert [(h["id"], h["kind"], h["memory_id"], h["content"]) for h in hits if h["id"] == memory_id] == [
                (memory_id, "raw", memory_id, DENTIST)], hits
        assert answered < AT_ONCE_SECONDS, f"{answered:.3f} s"
        with database.connection() as conn:
            words = _candidate(conn, api_settings, "alice", WORDS_QUERY, memory_id)
            meaning = _candidate(conn, api_settings, "alice", MEANING_QUERY, memory_id)
            assert words is not None and words.kind == "raw" and "exchange_text" in words.ranks, words
            assert meaning is not None and meaning.kind == "raw", meaning
            assert {"exchange_vector", "context_vector"} <= set(meaning.ranks), meaning
            assert meaning.ranks["exchange_vector"] == 1 and meaning.signals.cos_exchange > 0.3, meaning
            assert _legs_finding(conn, "alice", WORDS_QUERY, memory_id) >= {"bm25 exchange", "bm25 exchange in context"}
            assert _legs_finding(conn, "alice", MEANING_QUERY, memory_id) >= {"vector exchange",
                                                                              "vector exchange in context"}
            # The neighbour's context now holds the fact's words.
            assert "bm25 exchange in context" in _legs_finding(conn, "alice", WORDS_QUERY, neighbour_id)

        # As of a moment before it was said, it is not there; just after, it is.
        before = (said_at - timedelta(seconds=1)).isoformat()
        after = (said_at + timedelta(seconds=1)).isoformat()
        for query in (WORDS_QUERY, MEANING_QUERY):
            assert memory_id not in [h["id"] for h in search(query, as_of=before)], query
            assert memory_id in [h["id"] for h in search(query, as_of=after)], query

        # Forget it by the raw hit's id (the memory's): gone from everything at once.
        (hit,) = [h for h in by_meaning if h["id"] == memory_id]
        forgotten = api.delete(f"/api/memories/{hit['id']}")
        assert forgotten.status_code == 200, forgotten.text
        assert forgotten.json()["deleted_memory_ids"] == [memory_id]
        for query in (WORDS_QUERY, MEANING_QUERY):
            assert not [h for h in search(query) if h["id"] == memory_id or "Okafor" in h["content"]], query
            assert not [h for h in search(query, as_of=after) if h["id"] == memory_id], query
        # Forget removed that one memory, not recall: alice's locker code is still found.
        assert seeded.alice.secret in " ".join(h["content"] for h in search("What is my locker code?"))
    with database.connection() as conn:
        for query in (WORDS_QUERY, MEANING_QUERY):
            assert _candidate(conn, api_settings, "alice", query, memory_id) is None, query
            assert _legs_finding(conn, "alice", query, memory_id) == set(), query
        # Nor does the neighbour's context match the forgotten words any more.
        assert _legs_finding(conn, "alice", WORDS_QUERY, neighbour_id) & {"bm25 exchange",
                                                                          "bm25 exchange in context"} == set()
        assert conn.execute("SELECT count(*) FROM bm25_postings WHERE row_id = %s", (memory_id,)).fetchone()[0] == 0
    assert fetch_one(database, "SELECT count(*) FROM memories WHERE id = %s", (memory_id,))[0] == 0
