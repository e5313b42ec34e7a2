"""The memory proxy (issue 13): the real ``openai`` client → ``/v1`` of a live Yak → a loopback upstream.

Yak runs under uvicorn on 127.0.0.1 on the test's database (hashing embedder); the upstream is
the fake OpenAI-protocol server, which records every request it gets and every stream it sends.
Here: the loop (recall, block, answer, turn), forget in chat, and who is asking; the turns'
store is in test_proxy_turns.py, failures and bad input in test_proxy_failures.py.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from fastapi import FastAPI

from yak_loopback.openai_replies import Reply
from yak_loopback.openai_server import FakeOpenAIServer
from yak_pipeline.api.app import create_app
from yak_pipeline.core.memory_block import BLOCK_OPEN
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline_tests.api_fixtures import (  # noqa: F401 - fixtures among them
    ADMIN_KEY,
    Seeded,
    api_settings,
    rows_mentioning,
    seeded,
    serve_in_thread,
)
from yak_pipeline_tests.pipeline_helpers import fetch_all, fetch_one
from yak_pipeline_tests.proxy_fixtures import (  # noqa: F401 - fixtures among them
    QUESTION,
    UPSTREAM_KEY,
    chat,
    client,
    proxy_settings,
    sample,
    scrape,
    stored_turns,
    turns,
    yak_app,
    yak_url,
)
from yak_pipeline_tests.reliability_helpers import yak_env, yak_serve

# --- the loop ---------------------------------------------------------------------------------

def test_block_sits_before_the_last_user_message_and_the_turn_is_stored(
        yak_url: str, yak_app: FastAPI, upstream: FakeOpenAIServer, seeded: Seeded,  # noqa: F811
        database: Database) -> None:
    sent = chat()
    answer = client(yak_url, seeded.alice_key).chat.completions.create(model="fake-model", messages=sent)
    assert answer.choices[0].message.content == f"You said: {QUESTION}"
    assert answer.choices[0].finish_reason == "stop" and answer.usage is not None and answer.usage.total_tokens > 0
    assert answer.id.startswith("chatcmpl-fake-")  # the upstream's own body, not a rebuilt one

    (received,) = upstream.chat_requests
    messages = received.body["messages"]
    assert messages[:3] == sent[:3] and messages[4] == sent[3] and len(messages) == 5
    block = messages[3]
    assert block["role"] == "system" and block["content"].startswith(BLOCK_OPEN)
    assert seeded.alice.secret in block["content"] and seeded.bob.secret not in block["content"]
    assert {k: v for k, v in received.body.items() if k != "messages"} == {"model": "fake-model"}
    # The upstream gets Yak's upstream key, never the client's Yak key.
    assert received.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert seeded.alice_key not in json.dumps(received.headers)

    ((user_message, assistant_message, recalled),) = turns(yak_app, database, "alice")[-1:]
    assert (user_message, assistant_message) == (QUESTION, f"You said: {QUESTION}")
    assert seeded.alice.distillation_id in recalled
    memory = fetch_one(database, "SELECT content, status FROM memories WHERE content LIKE %s", (f"User: {QUESTION}%",))
    assert memory == (f"User: {QUESTION}\nAssistant: You said: {QUESTION}", "pending")
    actors = {r[0] for r in fetch_all(database, "SELECT actor FROM audit_log WHERE action = 'ingest'")}
    assert any(a.startswith("proxy:key:") for a in actors)

    metrics = scrape(yak_url)
    assert sample(metrics, 'yak_proxy_requests_total{outcome="answered",stream="false"}') == 1
    # Every line of the block is counted: the distillations (the turn's recalled ids, for warmth)
    # and the user's own words of the exchange whose distillation is in review (a raw memory).
    lines = [line for line in block["content"].splitlines() if line.startswith("- (")]
    assert any(line.startswith("- (the user's own words") and "Maybe I like" in line for line in lines)
    assert "The user may like" not in block["content"]  # the distillation in review itself: never
    assert sample(metrics, "yak_proxy_memories_injected_total") == len(lines) == len(recalled) + 1


def test_the_answer_names_the_injected_memories_in_a_header_and_show_block_logs_the_block(
        upstream: FakeOpenAIServer, seeded: Seeded, proxy_settings: Settings, database: Database,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    """X-Yak-Recalled-Ids lists what went into the prompt, streamed or not; with show-block the
    block itself is logged, and without it no memory text reaches the log."""
    for show in (False, True):
        configured = proxy_settings.model_copy(update={"proxy_show_block": show})
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="yak.proxy.block"), \
                serve_in_thread(create_app(configured, database=database)) as url:
            headers = {"Authorization": f"Bearer {seeded.alice_key}"}
            whole = httpx.post(f"{url}/v1/chat/completions", headers=headers, timeout=15,
                               json={"model": "fake-model", "messages": chat()})
            streamed = httpx.post(f"{url}/v1/chat/completions", headers=headers, timeout=15,
                                  json={"model": "fake-model", "messages": chat(), "stream": True})
        block = upstream.chat_requests[-1].body["messages"][3]["content"]
        for answer in (whole, streamed):
            assert answer.status_code == 200
            ids = answer.headers["x-yak-recalled-ids"].split(",")
            assert seeded.alice.distillation_id in ids and len(ids) == block.count("\n- ")
        logged = "\n".join(r.getMessage() for r in caplog.records if r.name == "yak.proxy.block")
        assert (block in logged) is show and (seeded.alice.secret in logged) is show


def test_a_short_follow_up_is_recalled_for_with_the_message_before_it(
        upstream: FakeOpenAIServer, seeded: Seeded, proxy_settings: Settings, database: Database) -> None:  # noqa: F811
    # "Remind me?" names nothing a memory holds (relevance 0.46 with the hashing embedder, under
    # the gate at t = 0.6); read after the message before it, which names the locker, 0.67.
    follow_up = [{"role": "user", "content": "I'm at the gym locker again."},
                 {"role": "assistant", "content": "Good luck with the workout."},
                 {"role": "user", "content": "Remind me?"}]
    for words, recalled in ((8, True), (0, False)):
        configured = proxy_settings.model_copy(update={"proxy_recall_threshold": 0.6, "proxy_follow_up_words": words})
        with serve_in_thread(create_app(configured, database=database)) as url:
            client(url, seeded.alice_key).chat.completions.create(model="fake-model", messages=follow_up)
        sent = upstream.chat_requests[-1].body["messages"]
        if recalled:
            assert sent[:2] == follow_up[:2] and sent[3] == follow_up[2] and sent[2]["content"].startswith(BLOCK_OPEN)
            assert f"The user's locker code is {seeded.alice.secret}." in sent[2]["content"]
            assert seeded.bob.secret not in sent[2]["content"]
        else:
            assert sent == follow_up  # "Remind me?" alone: nothing relevant, no block


def test_a_stream_is_relayed_byte_for_byte_and_its_full_answer_stored(
        yak_url: str, yak_app: FastAPI, upstream: FakeOpenAIServer, seeded: Seeded,  # noqa: F811
        database: Database) -> None:
    raw = httpx.post(f"{yak_url}/v1/chat/completions", headers={"Authorization": f"Bearer {seeded.alice_key}"},
                     json={"model": "fake-model", "messages": chat(), "stream": True,
                           "stream_options": {"include_usage": True}}, timeout=15)
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/event-stream")
    assert raw.content == upstream.streams_sent[-1]  # same events, same finish reason, same usage

    stream = client(yak_url, seeded.alice_key).chat.completions.create(
        model="fake-model", messages=chat(), stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == f"You said: {QUESTION}"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(text.split())
    assert BLOCK_OPEN in json.dumps(upstream.chat_requests[-1].body["messages"][-2])
    # Both streams were complete: the turn is stored once (the same exchange twice is one memory).
    assert turns(yak_app, database, "alice")[-1][:2] == (QUESTION, text)
    assert sample(scrape(yak_url), 'yak_proxy_requests_total{outcome="answered",stream="true"}') == 2


def test_an_upstream_that_ignores_stream_has_its_whole_answer_passed_on_and_stored(
        yak_url: str, yak_app: FastAPI, upstream: FakeOpenAIServer, seeded: Seeded,  # noqa: F811
        database: Database) -> None:
    completion = {"id": "chatcmpl-whole", "object": "chat.completion", "created": 0, "model": "fake-model",
                  "choices": [{"index": 0, "message": {"role": "assistant", "content": "All at once."},
                               "finish_reason": "stop"}]}
    upstream.script(Reply.raw(completion))
    response = httpx.post(f"{yak_url}/v1/chat/completions", headers={"Authorization": f"Bearer {seeded.alice_key}"},
                          json={"model": "fake-model", "messages": chat(), "stream": True}, timeout=15)
    assert response.status_code == 200 and response.json() == completion
    assert turns(yak_app, database, "alice")[-1][:2] == (QUESTION, "All at once.")


def test_concurrent_streams_each_get_and_store_their_own_answer(
        yak_url: str, yak_app: FastAPI, upstream: FakeOpenAIServer, seeded: Seeded,  # noqa: F811
        database: Database) -> None:
    def ask(number: int) -> str:
        stream = client(yak_url, seeded.alice_key).chat.completions.create(
            model="fake-model", stream=True, messages=[{"role": "user", "content": f"question number {number}"}])
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(8)))
    assert answers == [f"You said: question number {n}" for n in range(8)]
    stored = {u: a for u, a, _ in turns(yak_app, database, "alice")}
    assert all(stored[f"question number {n}"] == answers[n] for n in range(8))




# --- forget through chat ----------------------------------------------------------------------

def test_forget_by_phrase_asks_then_deletes_and_never_goes_upstream(
        yak_url: str, yak_app: FastAPI, upstream: FakeOpenAIServer, seeded: Seeded,  # noqa: F811
        database: Database) -> None:
    alice = client(yak_url, seeded.alice_key)
    listed = alice.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": f"/forget {seeded.alice.secret}"}])
    text = listed.choices[0].message.content
    assert "contain that phrase" in text and seeded.alice.secret in text
    token = text.split("/forget confirm ", 1)[1].split()[0]
    with database.connection() as conn:
        assert rows_mentioning(conn, seeded.alice.secret)  # nothing deleted yet

    stream = alice.chat.completions.create(model="fake-model", stream=True,
                                           messages=[{"role": "user", "content": f"/forget confirm {token}"}])
    done = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert done.startswith("Forgotten: 3 memories")
    with database.connection() as conn:
        assert set(rows_mentioning(conn, seeded.alice.secret)) <= {"audit_log"}
        assert rows_mentioning(conn, seeded.bob.secret)  # bob's are untouched
    assert upstream.chat_requests == []
    # Commands are not remembered.
    assert not [t for t in turns(yak_app, database, "alice") if t[0].startswith("/forget")]

    again = alice.chat.completions.create(model="fake-model",
                                          messages=[{"role": "user", "content": f"/forget confirm {token}"}])
    assert "unknown, used or expired" in again.choices[0].message.content


def test_forget_by_id_only_reaches_the_keys_own_memories(
        yak_url: str, upstream: FakeOpenAIServer, seeded: Seeded, database: Database) -> None:  # noqa: F811
    alice = client(yak_url, seeded.alice_key)
    refused = alice.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": f"/forget {seeded.bob.memory_id}"}])
    assert refused.choices[0].message.content.startswith(f"No memory {seeded.bob.memory_id} of yours")
    assert fetch_one(database, "SELECT count(*) FROM memories WHERE id = %s", (seeded.bob.memory_id,))[0] == 1
    done = alice.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": f"/forget {seeded.alice.memory_id}"}])
    assert done.choices[0].message.content.startswith("Forgotten: 1 memory")
    assert fetch_one(database, "SELECT count(*) FROM memories WHERE id = %s", (seeded.alice.memory_id,))[0] == 0
    unusable = alice.chat.completions.create(model="fake-model",
                                             messages=[{"role": "user", "content": "forget this memory"}])
    assert unusable.choices[0].message.content.startswith("Nothing was forgotten: 'forget this memory' needs")
    assert upstream.chat_requests == []


# --- who is asking ----------------------------------------------------------------------------

def test_a_user_key_reaches_only_its_own_memories_whatever_the_body_says(
        yak_url: str, yak_app: FastAPI, upstream: FakeOpenAIServer, seeded: Seeded,  # noqa: F811
        database: Database) -> None:
    client(yak_url, seeded.alice_key).chat.completions.create(model="fake-model", messages=chat(), user="bob")
    client(yak_url, seeded.bob_key).chat.completions.create(model="fake-model", messages=chat())
    alice_block, bob_block = (r.body["messages"][-2]["content"] for r in upstream.chat_requests)
    assert seeded.alice.secret in alice_block and seeded.bob.secret not in alice_block
    assert seeded.bob.secret in bob_block and seeded.alice.secret not in bob_block
    assert turns(yak_app, database, "alice")[-1][0] == QUESTION and turns(yak_app, database, "bob")[-1][0] == QUESTION
    assert len(turns(yak_app, database, "bob")) == 2  # the seeded turn and bob's own; alice's "user" did not land there


def test_an_admin_key_must_name_the_user_and_no_key_gets_no_memory(
        yak_url: str, upstream: FakeOpenAIServer, seeded: Seeded) -> None:  # noqa: F811
    admin = client(yak_url, ADMIN_KEY)
    with pytest.raises(openai.BadRequestError, match="an admin key must name the Yak user"):
        admin.chat.completions.create(model="fake-model", messages=chat())
    with pytest.raises(openai.BadRequestError, match="invalid user id"):
        admin.chat.completions.create(model="fake-model", messages=chat(), user="bob|x")
    admin.chat.completions.create(model="fake-model", messages=chat(), user="bob")
    assert seeded.bob.secret in upstream.chat_requests[-1].body["messages"][-2]["content"]
    with pytest.raises(openai.AuthenticationError, match="invalid or revoked API key"):
        client(yak_url, "not-a-yak-key").chat.completions.create(model="fake-model", messages=chat())
    for path in ("/v1/chat/completions", "/v1/models"):
        keyless = httpx.request("POST" if "chat" in path else "GET", f"{yak_url}{path}",
                                json={"model": "fake-model", "messages": chat()})
        assert keyless.status_code == 401 and keyless.json()["error"]["message"].startswith("missing API key")
    assert len(upstream.chat_requests) == 1


def test_models_are_passed_through(yak_url: str, upstream: FakeOpenAIServer, seeded: Seeded) -> None:  # noqa: F811
    assert [m.id for m in client(yak_url, seeded.alice_key).models.list()] == ["fake-model"]
    assert upstream.requests[-1].headers["authorization"] == f"Bearer {UPSTREAM_KEY}"


def test_yak_proxy_serves_the_proxy_alone(db_url: str, upstream: FakeOpenAIServer, seeded: Seeded,  # noqa: F811
                                          database: Database, tmp_path: Path) -> None:
    env = yak_env(db_url, tmp_path / "home", YAK_UPSTREAM_BASE_URL=upstream.base_url,
                  YAK_UPSTREAM_API_KEY=UPSTREAM_KEY, YAK_ADMIN_API_KEY=ADMIN_KEY, YAK_PROXY_RECALL_THRESHOLD="0.1")
    with yak_serve(env, tmp_path, command="proxy", args=("--json",)) as server:
        url = server.url
        answer = client(url, seeded.alice_key).chat.completions.create(model="fake-model", messages=chat())
        assert answer.choices[0].message.content == f"You said: {QUESTION}"
        assert seeded.alice.secret in upstream.chat_requests[-1].body["messages"][-2]["content"]
        assert httpx.get(f"{url}/api/memories", headers={"X-API-Key": ADMIN_KEY}).status_code == 404
    assert json.loads(server.stdout.read_text().splitlines()[0]) == {"url": f"{url}/v1",
                                                                     "upstream": upstream.base_url, "warnings": []}
    assert stored_turns(database, "alice")[-1][0] == QUESTION
    assert UPSTREAM_KEY not in server.logs()
