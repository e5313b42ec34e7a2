"""Recall, context, turns and synchronous warmth evaluation through the API, on distilled data."""

from __future__ import annotations

import pytest

from yak_loopback.openai_replies import Reply
from yak_loopback.openai_server import FakeOpenAIServer
from yak_pipeline.api.app import create_app
from yak_pipeline.embeddings.hashing import HashingEmbedder
from yak_pipeline.llm import OpenAIChatProvider, RulesProvider
from yak_pipeline.llm.prompts import parse_payload
from yak_pipeline.services.distill import DistillJob, distill_memories
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline_tests.api_fixtures import ADMIN_KEY, admin, api_settings, app, client_with  # noqa: F401

EXCHANGES = {
    "alice": ["User: I live in Lisbon with my partner.\nAssistant: Lisbon is lovely!",
              "User: My favourite food is ramen.\nAssistant: Great choice."],
    "bob": ["User: I live in Oslo.\nAssistant: Cold but beautiful."],
}


def _post_and_distil(client, database: Database) -> dict[str, list[str]]:  # noqa: ANN001
    ids: dict[str, list[str]] = {}
    for user, exchanges in EXCHANGES.items():
        for text in exchanges:
            response = client.post("/api/memories/", json={"content": text, "user_id": user})
            assert response.status_code == 201
            ids.setdefault(user, []).append(response.json()["id"])
    job = DistillJob(database, llm=RulesProvider(), embedder=HashingEmbedder(384), prompt_version="v1")
    report = distill_memories(job, [m for ms in ids.values() for m in ms])
    assert report.rows_out == 3 and report.failed == 0
    return ids


def test_search_returns_the_users_relevant_distillation_ranked(admin, database: Database) -> None:  # noqa: ANN001
    _post_and_distil(admin, database)
    response = admin.post("/api/distillations/search", json={"query": "Where does the user live? Lisbon",
                                                             "user_id": "alice", "threshold": 0.1})
    assert response.status_code == 200
    hits = response.json()
    assert hits and "Lisbon" in hits[0]["content"]
    assert all("Oslo" not in h["content"] for h in hits)
    assert set(hits[0]) >= {"id", "content", "confidence", "tier", "warmth", "score", "is_core"}
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
    assert hits[0]["is_core"] == (hits[0]["tier"] == "core")
    # The default threshold 0.7 is strict for feature-hashing vectors: nothing unrelated passes.
    strict = admin.post("/api/distillations/search", json={"query": "quantum chromodynamics", "user_id": "alice"})
    assert strict.status_code == 200 and strict.json() == []


def test_context_renders_one_isolated_block(admin, database: Database) -> None:  # noqa: ANN001
    _post_and_distil(admin, database)
    response = admin.post("/api/context", json={"query": "What food do I like? ramen", "user_id": "alice",
                                                "threshold": 0.1, "system_prompt": "You are kind."})
    body = response.json()
    assert response.status_code == 200 and body["recall_error"] is None
    assert body["block"].startswith("<memories>") and body["block"].endswith("</memories>")
    assert "ramen" in body["block"] and body["recalled_ids"]
    assert [m["role"] for m in body["messages"]] == ["system", "system", "user"]
    assert body["messages"][0]["content"] == "You are kind." and body["messages"][1]["content"] == body["block"]


def test_context_without_memories_has_no_block(admin) -> None:  # noqa: ANN001
    body = admin.post("/api/context", json={"query": "anything", "user_id": "carol"}).json()
    assert body["block"] == "" and body["recalled_ids"] == []
    # No system prompt given: no empty system message either, just the user's.
    assert body["messages"] == [{"role": "user", "content": "anything"}]
    # Still a prompt (a new user's first turn must work), but not silently: carol has nothing.
    assert body["note"] == "user 'carol' has no memories"
    # Searching a user with no memories at all is a 404 naming them, not an empty answer.
    searched = admin.post("/api/distillations/search", json={"query": "anything", "user_id": "carol"})
    assert searched.status_code == 404 and searched.json() == {"detail": "user 'carol' has no memories"}


def test_a_users_first_turn_says_the_user_is_new(admin) -> None:  # noqa: ANN001
    turn = {"user_id": "dave", "user_message": "Hi, I'm Dave.", "assistant_message": "Hello Dave!"}
    first = admin.post("/api/turns", json=turn)
    assert first.status_code == 202 and first.json()["new_user"] is True
    second = admin.post("/api/turns", json={**turn, "user_message": "I like tea."})
    assert second.json()["new_user"] is False
    # Once dave has a memory, an empty recall is no longer explained away as "no memories".
    assert admin.post("/api/context", json={"query": "zebra", "user_id": "dave"}).json()["note"] is None


def test_turns_store_the_exchange_and_queue_the_turn_once(admin, database: Database) -> None:  # noqa: ANN001
    _post_and_distil(admin, database)
    hit = admin.post("/api/distillations/search", json={"query": "Lisbon", "user_id": "alice",
                                                        "threshold": 0.1}).json()[0]
    turn = {"user_id": "alice", "user_message": "Any cafés near me?", "assistant_message": "Try one in Alfama.",
            "recalled_ids": [hit["id"]]}
    first = admin.post("/api/turns", json=turn)
    assert first.status_code == 202 and first.json()["queued"] is True
    again = admin.post("/api/turns", json=turn)
    assert again.status_code == 202 and again.json()["queued"] is False
    assert again.json()["turn_id"] == first.json()["turn_id"]
    with database.connection() as conn:
        memory = conn.execute("SELECT content, source, status FROM memories WHERE id = %s",
                              (first.json()["memory_id"],)).fetchone()
        turns = conn.execute("SELECT memory_id, recalled_ids, status FROM turns").fetchall()
    assert memory == ("User: Any cafés near me?\nAssistant: Try one in Alfama.", "api", "pending")
    assert len(turns) == 1 and str(turns[0][0]) == first.json()["memory_id"]
    assert [str(i) for i in turns[0][1]] == [hit["id"]] and turns[0][2] == "pending"
    queue = admin.get("/api/queue").json()
    assert queue["pending_turns"] == 1 and queue["pending_memories"] == 1


@pytest.fixture
def llm_app(api_settings: Settings, database: Database, openai_server: FakeOpenAIServer):  # noqa: ANN201
    """The app with an OpenAI-compatible LLM: the loopback server through the real openai client."""
    provider = OpenAIChatProvider(openai_server.base_url, "fake-model", max_retries=0, timeout_seconds=5)
    return create_app(api_settings, database=database, llm=provider)


def test_warmth_evaluate_applies_the_rule_through_the_llm(llm_app, database: Database,  # noqa: ANN001
                                                          openai_server: FakeOpenAIServer) -> None:
    client = client_with(llm_app, ADMIN_KEY)
    _post_and_distil(client, database)
    hit = client.post("/api/distillations/search", json={"query": "Lisbon", "user_id": "alice",
                                                         "threshold": 0.1}).json()[0]
    openai_server.script(Reply.json({"score": 0.9}), Reply.json({"score": 0.1}))
    up = client.post("/api/warmth/evaluate", json={"memory_id": hit["id"], "context": "User: cafés in Lisbon?",
                                                   "evaluator": "tester"})
    assert up.status_code == 200
    assert up.json() == {"memory_id": hit["id"], "relevance_score": 0.9, "warmth_change": pytest.approx(0.1),
                         "new_warmth": pytest.approx(0.6)}
    down = client.post("/api/warmth/evaluate", json={"memory_id": hit["id"], "context": "User: weather?"}).json()
    assert down["warmth_change"] == pytest.approx(-0.2) and down["new_warmth"] == pytest.approx(0.4)
    assert len(openai_server.chat_requests) == 2
    history = client.get(f"/api/warmth/{hit['id']}").json()
    assert history["warmth"] == pytest.approx(0.4)
    assert [(e["reason"], e["evaluator"]) for e in history["history"]] == [("manual", "openai"), ("manual", "tester")]


def test_warmth_evaluate_answers_502_when_the_llm_fails(llm_app, database: Database,  # noqa: ANN001
                                                        openai_server: FakeOpenAIServer) -> None:
    client = client_with(llm_app, ADMIN_KEY)
    _post_and_distil(client, database)
    hit = client.post("/api/distillations/search", json={"query": "Lisbon", "user_id": "alice",
                                                         "threshold": 0.1}).json()[0]
    openai_server.script(Reply.status(500))
    response = client.post("/api/warmth/evaluate", json={"memory_id": hit["id"], "context": "User: hi"})
    assert response.status_code == 502 and response.json()["detail"].startswith("the evaluator failed")
    with database.connection() as conn:
        assert conn.execute("SELECT count(*) FROM warmth_events").fetchone()[0] == 0


def _judging_replier(request: dict) -> Reply:  # noqa: ANN001 - the fake server's request body
    """A model that finds only the ramen memory relevant (its judgement is what is under test)."""
    task, payload = parse_payload(request["messages"][-1]["content"])
    assert task == "relevance"
    return Reply.json({"score": 0.9 if "ramen" in payload["memory"] else 0.2})


@pytest.fixture
def judged_app(api_settings: Settings, database: Database, openai_server: FakeOpenAIServer):  # noqa: ANN201
    """The app with ``YAK_RECALL_LLM_JUDGE`` on, its LLM the loopback server through the real openai client."""
    settings = api_settings.model_copy(update={"recall_llm_judge": True, "llm_base_url": openai_server.base_url})
    provider = OpenAIChatProvider(openai_server.base_url, "fake-model", max_retries=0, timeout_seconds=5)
    return create_app(settings, database=database, llm=provider)


def test_the_llm_judge_drops_what_it_finds_irrelevant_and_keeps_the_engines_order(
        judged_app, database: Database, openai_server: FakeOpenAIServer) -> None:  # noqa: ANN001
    client = client_with(judged_app, ADMIN_KEY)
    _post_and_distil(client, database)
    query = {"query": "What food do I like? ramen Lisbon", "user_id": "alice", "threshold": 0.05, "explain": True}
    openai_server.clear()
    openai_server.replier = _judging_replier
    hits = client.post("/api/distillations/search", json=query).json()
    # Both of alice's memories pass the engine's gate at t = 0.05; the judge asked about each, with
    # the user's message as the turn, and kept only the one it scored >= 0.5.
    turns = sorted(parse_payload(r.body["messages"][-1]["content"])[1]["memory"]
                   for r in openai_server.chat_requests)
    assert len(turns) == 2 and any("ramen" in t for t in turns) and any("Lisbon" in t for t in turns)
    assert all(parse_payload(r.body["messages"][-1]["content"])[1]["turn"] == "User: " + query["query"]
               for r in openai_server.chat_requests)
    assert [("ramen" in h["content"], h["explain"]["llm_judgement"]) for h in hits] == [(True, 0.9)]
    block = client.post("/api/context", json={k: v for k, v in query.items() if k != "explain"}).json()
    assert "ramen" in block["block"] and "Lisbon" not in block["block"]


def test_the_llm_judge_failing_leaves_the_engines_hits(judged_app, database: Database,  # noqa: ANN001
                                                        openai_server: FakeOpenAIServer) -> None:
    client = client_with(judged_app, ADMIN_KEY)
    _post_and_distil(client, database)
    openai_server.replier = lambda request: Reply.status(500)
    hits = client.post("/api/distillations/search", json={"query": "What food do I like? ramen Lisbon",
                                                          "user_id": "alice", "threshold": 0.05,
                                                          "explain": True}).json()
    assert len(hits) == 2 and all("llm_judgement" not in h["explain"] for h in hits)


def test_without_the_setting_recall_asks_no_llm(llm_app, database: Database,  # noqa: ANN001
                                                 openai_server: FakeOpenAIServer) -> None:
    client = client_with(llm_app, ADMIN_KEY)
    _post_and_distil(client, database)
    openai_server.clear()
    hits = client.post("/api/distillations/search", json={"query": "What food do I like? ramen Lisbon",
                                                          "user_id": "alice", "threshold": 0.05}).json()
    assert len(hits) == 2 and openai_server.chat_requests == []
