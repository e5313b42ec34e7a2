"""The memory proxy (issue 13): the real ``openai`` client → ``/v1`` of a live Yak → a loopback upstream.

Yak runs under uvicorn on 127.0.0.1 on the test's database (hashing embedder); the upstream is
the fake OpenAI-protocol server, which records every request it gets and every stream it sends.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

import httpx
import openai
import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from pydantic import SecretStr

from yak_loopback.anthropic_server import FakeAnthropicServer
from yak_loopback.openai_replies import Reply
from yak_loopback.openai_server import FakeOpenAIServer
from yak_pipeline.api.app import create_app, create_proxy_app
from yak_pipeline.core.memory_block import BLOCK_OPEN
from yak_pipeline.defs.scores.assets import warmth
from yak_pipeline.embeddings.hashing import HashingEmbedder
from yak_pipeline.embeddings.openai_embedder import OpenAIEmbedder
from yak_pipeline.services.turn_writer import TurnWriter
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline_tests.api_fixtures import (  # noqa: F401
    ADMIN_KEY,
    Seeded,
    api_settings,
    rows_mentioning,
    seeded,
    serve_in_thread,
)
from yak_pipeline_tests.loopback_fixtures import anthropic_upstream  # noqa: F401
from yak_pipeline_tests.pipeline_helpers import fetch_all, fetch_one, new_instance, pipeline_resources, run_partition
from yak_pipeline_tests.reliability_helpers import yak_env, yak_serve

UPSTREAM_KEY = "sk-upstream-secret-5f2a9c"
QUESTION = "What is my locker code?"


@pytest.fixture
def proxy_settings(api_settings: Settings, upstream: FakeOpenAIServer) -> Settings:  # noqa: F811
    """Settings whose upstream is the loopback server (threshold 0.1: the seeded memories are recalled)."""
    return api_settings.model_copy(update={"upstream_base_url": upstream.base_url,
                                           "upstream_api_key": SecretStr(UPSTREAM_KEY),
                                           "proxy_recall_threshold": 0.1, "upstream_timeout_seconds": 2.0})


@pytest.fixture
def yak_app(proxy_settings: Settings, database: Database) -> FastAPI:
    """Yak (API and proxy) on the test's database."""
    return create_app(proxy_settings, database=database)


@pytest.fixture
def yak_url(yak_app: FastAPI) -> Iterator[str]:
    """``yak_app`` live under uvicorn."""
    with serve_in_thread(yak_app) as url:
        yield url


def client(yak_url: str, key: str | None) -> openai.OpenAI:
    """The real OpenAI client pointed at Yak's proxy with ``key`` (no retries: errors show at once)."""
    return openai.OpenAI(base_url=f"{yak_url}/v1", api_key=key or "", max_retries=0, timeout=15)


def chat(system: str = "You are terse.") -> list[dict]:
    """A conversation with history whose last message is the question."""
    return [{"role": "system", "content": system}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": QUESTION}]


def settle(app: FastAPI) -> None:
    """Wait until ``app``'s proxy has stored every turn it answered (it stores them after the response)."""
    assert app.state.services.proxy.turns.wait(timeout=15), "the proxy's turns were not stored in 15 s"


def turns(app: FastAPI, database: Database, user_id: str) -> list[tuple]:
    """The user's turns once ``app`` has stored all it answered: user message, assistant message, recalled ids."""
    settle(app)
    return stored_turns(database, user_id)


def stored_turns(database: Database, user_id: str) -> list[tuple]:
    """The user's turns in the database now: user message, assistant message, recalled ids (as text)."""
    return fetch_all(database, """SELECT user_message, assistant_message, recalled_ids::text[] FROM turns
                                  WHERE user_id = %s ORDER BY created_at""", (user_id,))


def scrape(yak_url: str) -> str:
    """The Prometheus text of ``/metrics``."""
    return httpx.get(f"{yak_url}/metrics", headers={"X-API-Key": ADMIN_KEY}).text


def sample(text: str, line_start: str) -> float:
    """The value of the first sample line starting with ``line_start``."""
    return float(next(line for line in text.splitlines() if line.startswith(line_start)).rsplit(" ", 1)[1])


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


def test_the_answer_does_not_wait_for_its_turn_to_be_stored_but_shutting_down_does(
        proxy_settings: Settings, database: Database, upstream: FakeOpenAIServer, seeded: Seeded) -> None:  # noqa: F811
    """A turn is stored after its response has gone out, one after another in the order answered;
    a server stopping first stores every turn it answered."""
    app = create_app(proxy_settings, database=database)
    writer = app.state.services.proxy.turns
    with ExitStack() as server, database.connection() as blocker:
        url = server.enter_context(serve_in_thread(app))
        blocker.execute("LOCK TABLE turns IN EXCLUSIVE MODE")  # no turn can be written until this commits
        alice = client(url, seeded.alice_key)
        streamed = "".join(c.choices[0].delta.content or "" for c in alice.chat.completions.create(
            model="fake-model", messages=chat(), stream=True) if c.choices)
        whole = alice.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "and then?"}])
        assert (streamed, whole.choices[0].message.content) == (f"You said: {QUESTION}", "You said: and then?")
        assert writer.waiting == 2 and not writer.wait(timeout=0.2)  # both answered, neither stored
        stopping = threading.Thread(target=server.close)  # closing it again on the way out does nothing
        stopping.start()
        stopping.join(timeout=1)
        assert stopping.is_alive()  # the server waits for the turns it answered
        blocker.commit()
        stopping.join(timeout=15)
    assert not stopping.is_alive() and writer.waiting == 0
    assert [t[:2] for t in stored_turns(database, "alice")[-2:]] == [(QUESTION, streamed),
                                                                     ("and then?", "You said: and then?")]


def test_a_full_store_queue_makes_the_chat_store_its_own_turn_before_answering(
        yak_url: str, yak_app: FastAPI, upstream: FakeOpenAIServer, seeded: Seeded,  # noqa: F811
        database: Database) -> None:
    yak_app.state.services.proxy.turns.max_waiting = 0  # as if 256 turns were queued already
    answer = client(yak_url, seeded.alice_key).chat.completions.create(model="fake-model", messages=chat())
    # Read without waiting for the writer: the turn was stored before the response went out.
    assert stored_turns(database, "alice")[-1][:2] == (QUESTION, answer.choices[0].message.content)


def _writer_is_held_at_the_lock(database: Database) -> bool:
    """Whether a session (the turn writer) is waiting for the lock on ``turns`` a test holds."""
    return fetch_one(database, "SELECT count(*) FROM pg_locks WHERE relation = 'turns'::regclass AND NOT granted")[0] > 0


def _exchange_vectors(database: Database, question: str) -> list[tuple]:
    """(own vector present, context vector present) of each stored exchange whose user side is ``question``."""
    return fetch_all(database, """SELECT embedding IS NOT NULL, context_embedding IS NOT NULL FROM memories
                                  WHERE content LIKE %s""", (f"User: {question}\nAssistant:%",))


def _chat_raw(url: str, key: str, text: str) -> httpx.Response:
    """One chat sent as ASCII-escaped JSON (so ``text`` may hold what the openai client cannot encode)."""
    body = {"model": "fake-model", "messages": [{"role": "user", "content": text}]}
    return httpx.post(f"{url}/v1/chat/completions", content=json.dumps(body).encode("ascii"), timeout=15,
                      headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})


@pytest.mark.parametrize("with_a_failing_turn", [False, True])
def test_turns_queued_together_are_stored_once_each_with_vectors_in_one_batch(
        with_a_failing_turn: bool, yak_url: str, yak_app: FastAPI, upstream: FakeOpenAIServer,  # noqa: F811
        seeded: Seeded, database: Database, caplog: pytest.LogCaptureFixture) -> None:  # noqa: F811
    """The writer takes every turn that queued while it was busy as one batch: each is written on its
    own (a turn whose write fails, here one whose text PostgreSQL cannot take, is counted and logged
    and the others are stored), then the batch's exchanges get both their vectors."""
    caplog.set_level(logging.DEBUG, logger="yak.proxy")
    writer = yak_app.state.services.proxy.turns
    questions = [f"queued question number {n}" for n in range(5)]
    broken = "a lone surrogate \ud800 here"  # valid JSON; no UTF-8 for it, so its write fails
    sent = [*questions[:2], broken, *questions[2:]] if with_a_failing_turn else questions
    with database.connection() as blocker:
        blocker.execute("LOCK TABLE turns IN EXCLUSIVE MODE")  # the writer's first store waits here
        assert _chat_raw(yak_url, seeded.alice_key, "first, stored alone").status_code == 200
        deadline = time.monotonic() + 10
        while not _writer_is_held_at_the_lock(database):  # it has taken the first turn as a batch of one
            assert time.monotonic() < deadline, "the writer never reached the locked table"
            time.sleep(0.01)
        for text in sent:
            answer = _chat_raw(yak_url, seeded.alice_key, text)
            assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"].startswith(
                "You said: ")
        assert writer.waiting == 1 + len(sent)
        blocker.commit()
    settle(yak_app)
    assert f"stored a batch of {len(sent)} proxied turns" in caplog.text
    for question in questions:
        assert _exchange_vectors(database, question) == [(True, True)], question
    assert [t[0] for t in stored_turns(database, "alice")[-len(questions):]] == questions  # in the order answered
    failed = [r for r in caplog.records if "was not stored" in r.getMessage()]
    assert len(failed) == (1 if with_a_failing_turn else 0)
    if with_a_failing_turn:
        assert "UnicodeEncodeError" in failed[0].getMessage()
        assert sample(scrape(yak_url), 'yak_proxy_degradations_total{reason="turn_not_stored"}') == 1


def test_a_batch_whose_embedder_is_down_is_stored_without_vectors_for_the_pipeline(
        proxy_settings: Settings, database: Database, upstream: FakeOpenAIServer, seeded: Seeded,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    """The embedder failing (here an OpenAI-protocol one whose server is gone) only logs: every turn of
    the batch stays stored, without vectors, which the pipeline gives later."""
    down = OpenAIEmbedder(base_url="http://127.0.0.1:9/v1", model="m", dimensions=384, timeout_seconds=1,
                          max_retries=0)
    app = create_app(proxy_settings, database=database, embedder=down)
    questions = [f"stored while the embedder is down {n}" for n in range(3)]
    with ExitStack() as stack, database.connection() as blocker:
        url = stack.enter_context(serve_in_thread(app))
        blocker.execute("LOCK TABLE turns IN EXCLUSIVE MODE")  # the three queue up behind this
        for question in questions:
            assert _chat_raw(url, seeded.alice_key, question).status_code == 200
        assert app.state.services.proxy.turns.waiting == 3
        blocker.commit()
        settle(app)
    for question in questions:
        assert _exchange_vectors(database, question) == [(False, False)], question
    assert "could not embed" in caplog.text and "the pipeline will" in caplog.text


@pytest.mark.parametrize("protocol", ["chat", "messages"])
def test_a_stream_under_back_pressure_ends_before_the_chat_stores_its_own_turn(
        protocol: str, proxy_settings: Settings, database: Database, upstream: FakeOpenAIServer,  # noqa: F811
        anthropic_upstream: FakeAnthropicServer, seeded: Seeded) -> None:  # noqa: F811
    """With the writer's queue full, a streamed chat stores its own turn, but only after the client has
    every event (``message_stop``, ``[DONE]``); the response ends once the turn is stored."""
    settings = proxy_settings.model_copy(update={"upstream_anthropic_base_url": anthropic_upstream.base_url})
    app = create_app(settings, database=database)
    writer = app.state.services.proxy.turns
    writer.max_waiting = 0  # as if 256 turns were queued already
    question = f"back pressure over {protocol}?"
    if protocol == "messages":
        path, last_event = "/v1/messages", "message_stop"
        headers = {"x-api-key": "sk-ant-client", "X-Yak-Key": seeded.alice_key, "anthropic-version": "2023-06-01"}
        body = {"model": "claude-fake-1", "max_tokens": 100, "stream": True,
                "messages": [{"role": "user", "content": question}]}
    else:
        path, last_event = "/v1/chat/completions", "[DONE]"
        headers = {"Authorization": f"Bearer {seeded.alice_key}"}
        body = {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": question}]}
    last_seen, ended, lines = threading.Event(), threading.Event(), []

    def read(url: str) -> None:
        with httpx.stream("POST", f"{url}{path}", json=body, headers=headers, timeout=30) as response:
            for line in response.iter_lines():
                lines.append(line)
                if last_event in line:
                    last_seen.set()
        ended.set()

    with ExitStack() as stack, database.connection() as blocker:
        url = stack.enter_context(serve_in_thread(app))
        blocker.execute("LOCK TABLE turns IN EXCLUSIVE MODE")  # the chat's own store waits here
        reader = threading.Thread(target=read, args=(url,))
        reader.start()
        assert last_seen.wait(15), f"{last_event} did not reach the client while its turn was being stored"
        deadline = time.monotonic() + 10
        while not _writer_is_held_at_the_lock(database):  # the chat's own store, not the writer's
            assert time.monotonic() < deadline, "the chat never tried to store its turn"
            time.sleep(0.01)
        assert not ended.is_set() and writer.waiting == 0  # the response is still open; nothing was queued
        assert not exchanges_stored(database, question)
        blocker.commit()
        reader.join(timeout=15)
    assert ended.is_set() and any(last_event in line for line in lines)
    # Read as soon as the response ended, without waiting for the writer: the chat stored it itself.
    assert len(exchanges_stored(database, question)) == 1 and writer.waiting == 0


def exchanges_stored(database: Database, question: str) -> list[tuple]:
    """The stored exchanges whose user side is ``question``."""
    return fetch_all(database, "SELECT id FROM memories WHERE content LIKE %s", (f"User: {question}\nAssistant:%",))


def test_the_proxy_loads_the_document_model_as_it_starts_without_making_health_wait(
        proxy_settings: Settings, database: Database) -> None:
    """``yak proxy``'s app loads the local document model in the background as it starts: ``/health``
    answers while the load is held up, and once it is done the model is there for the first turn."""
    from yak_pipeline.embeddings import local

    app = create_proxy_app(proxy_settings, database=database, embedder=local.LocalMiniLMEmbedder())
    with local._MODEL_LOCK, serve_in_thread(app) as url:  # the load waits for this lock
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        proxy = app.state.services.proxy
        assert not proxy.documents_warm.is_set()
    assert proxy.documents_warm.wait(120) and local._MODEL is not None


def test_the_turn_writer_batches_what_waits_keeps_order_bounds_its_queue_and_outlives_a_failed_batch() -> None:
    taken, gate, batches = threading.Event(), threading.Event(), []

    def store(batch: list) -> None:
        if "boom" in batch:
            raise ZeroDivisionError
        taken.set()
        gate.wait(10)
        batches.append(list(batch))

    writer = TurnWriter(store, max_waiting=4, max_batch=2)
    assert writer.submit(1) and taken.wait(10)  # an idle writer takes a lone turn at once
    assert writer.submit(2) and writer.submit(3) and writer.submit(4)
    assert not writer.submit(5)  # full: the caller stores it itself
    assert writer.waiting == 4 and not writer.wait(timeout=0.1)
    gate.set()
    # What queued while the first batch was stored goes in batches of at most max_batch, in order.
    assert writer.wait(timeout=10) and batches == [[1], [2, 3], [4]] and writer.waiting == 0
    writer.store_now([5])  # in the caller's thread, as the writer stores a batch
    assert batches[-1] == [5]
    assert writer.submit("boom") and writer.wait(timeout=10) and writer.waiting == 0  # logged, not raised
    assert writer.submit(6) and writer.wait(timeout=10) and batches[-1] == [6]
    writer.max_waiting = 0
    assert not writer.submit(7) and writer.submit(7, over_limit=True)  # a chat whose client left
    assert writer.wait(timeout=10) and batches[-1] == [7]


def test_warmth_changes_after_the_pipeline_evaluates_a_proxied_turn(
        yak_url: str, yak_app: FastAPI, upstream: FakeOpenAIServer, seeded: Seeded, database: Database,  # noqa: F811
        settings: Settings) -> None:
    upstream.script(Reply.text(f"Your locker code is {seeded.alice.secret}."))
    client(yak_url, seeded.alice_key).chat.completions.create(model="fake-model", messages=chat())
    settle(yak_app)
    before = fetch_one(database, "SELECT warmth FROM distillations WHERE id = %s", (seeded.alice.distillation_id,))[0]
    today = datetime.now(UTC).date()
    result = run_partition(new_instance("alice"), pipeline_resources(settings), "alice", today, assets=[warmth])
    assert result.success
    events = fetch_all(database, """SELECT e.distillation_id::text, e.delta FROM warmth_events e
                                    JOIN turns t ON t.id = e.turn_id WHERE t.user_message = %s""", (QUESTION,))
    assert (seeded.alice.distillation_id, pytest.approx(0.1)) in [(d, float(x)) for d, x in events]
    after = fetch_one(database, "SELECT warmth FROM distillations WHERE id = %s", (seeded.alice.distillation_id,))[0]
    assert after == pytest.approx(before + 0.1)


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


# --- failures ---------------------------------------------------------------------------------

def test_upstream_errors_reach_the_client_with_their_status_and_nothing_is_stored(
        yak_url: str, yak_app: FastAPI, upstream: FakeOpenAIServer, seeded: Seeded,  # noqa: F811
        database: Database) -> None:
    alice = client(yak_url, seeded.alice_key)
    stored_before = len(turns(yak_app, database, "alice"))
    upstream.script(Reply.status(500), Reply.status(404, {"error": {"message": "model 'nope' not found",
                                                                     "type": "not_found_error"}}),
                    Reply.status(429), Reply.raw({"hello": "world"}), Reply.delay(5))
    with pytest.raises(openai.InternalServerError, match="the upstream model server answered 500: fake server error"):
        alice.chat.completions.create(model="fake-model", messages=chat())
    with pytest.raises(openai.NotFoundError, match="model 'nope' not found") as missing:
        alice.chat.completions.create(model="nope", messages=chat())
    assert missing.value.body["type"] == "not_found_error"
    with pytest.raises(openai.RateLimitError):
        alice.chat.completions.create(model="fake-model", messages=chat(), stream=True)
    with pytest.raises(openai.APIStatusError, match="not a chat completion") as garbage:
        alice.chat.completions.create(model="fake-model", messages=chat())
    assert garbage.value.status_code == 502
    with pytest.raises(openai.APIStatusError, match="did not answer in time") as slow:
        alice.chat.completions.create(model="fake-model", messages=chat())
    assert slow.value.status_code == 504
    assert len(turns(yak_app, database, "alice")) == stored_before
    # Each error is counted before its response is sent. The 2 s timeout makes the request
    # middleware's buffer flush due, and it runs after the 504 has gone out, beside this scrape; the
    # scrape's flush waits for one in flight (MetricsBuffer._flushing), else it could read the
    # database before the middleware's INSERT commits and find none of the four (StopIteration).
    assert sample(scrape(yak_url), 'yak_proxy_requests_total{outcome="upstream_error",stream="false"}') == 4


def test_an_unreachable_upstream_is_a_502(proxy_settings: Settings, database: Database, seeded: Seeded) -> None:  # noqa: F811
    gone = FakeOpenAIServer().start()
    dead_url = gone.base_url
    gone.stop()
    app = create_app(proxy_settings.model_copy(update={"upstream_base_url": dead_url}), database=database)
    with serve_in_thread(app) as url:
        with pytest.raises(openai.APIStatusError, match="could not reach the upstream model server") as refused:
            client(url, seeded.alice_key).chat.completions.create(model="fake-model", messages=chat())
    assert refused.value.status_code == 502


def test_a_stream_killed_midway_ends_in_an_error_and_stores_no_turn(
        yak_url: str, yak_app: FastAPI, upstream: FakeOpenAIServer, seeded: Seeded,  # noqa: F811
        database: Database) -> None:
    stored_before = len(turns(yak_app, database, "alice"))
    upstream.script(Reply.cut("one two three four five six", after=3))
    stream = client(yak_url, seeded.alice_key).chat.completions.create(model="fake-model", messages=chat(), stream=True)
    received = []
    with pytest.raises(openai.APIError, match="stopped in the middle of its answer"):
        for chunk in stream:
            received.append(chunk.choices[0].delta.content or "")
    assert "".join(received) == "one two "  # what came before the cut was relayed as it came
    assert len(turns(yak_app, database, "alice")) == stored_before
    metrics = scrape(yak_url)
    assert sample(metrics, 'yak_proxy_degradations_total{reason="upstream_cut"}') == 1
    assert sample(metrics, 'yak_proxy_requests_total{outcome="upstream_cut",stream="true"}') == 1


def test_a_client_that_hangs_up_mid_stream_stops_the_upstream_and_stores_no_turn(
        yak_url: str, yak_app: FastAPI, upstream: FakeOpenAIServer, seeded: Seeded,  # noqa: F811
        database: Database) -> None:
    """The user closed the chat while the model was still writing: the proxy stops reading the
    upstream (its connection is closed, not drained to the end), stores nothing, counts it, and
    goes on serving."""
    stored_before = len(turns(yak_app, database, "alice"))
    words = " ".join(f"word{i}" for i in range(60))
    upstream.script(Reply.text(words).slowly(0.05))  # three seconds of answer, one word at a time
    body = {"model": "fake-model", "messages": chat(), "stream": True}
    with httpx.Client(timeout=15) as http, http.stream(
            "POST", f"{yak_url}/v1/chat/completions", json=body,
            headers={"Authorization": f"Bearer {seeded.alice_key}"}) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        received = [line for line, _ in zip(lines, range(6)) if line.startswith("data:")]
    assert received and "[DONE]" not in "".join(received)  # hung up in the middle
    deadline = time.monotonic() + 10
    while upstream.streams_dropped_by_the_client == 0:
        assert time.monotonic() < deadline, "the proxy kept reading the upstream after its client had gone"
        time.sleep(0.05)
    assert len(turns(yak_app, database, "alice")) == stored_before
    deadline = time.monotonic() + 5
    while 'yak_proxy_requests_total{outcome="client_gone",stream="true"}' not in scrape(yak_url):
        assert time.monotonic() < deadline, "the hang-up was not counted"
        time.sleep(0.05)
    assert sample(scrape(yak_url), 'yak_proxy_requests_total{outcome="client_gone",stream="true"}') == 1
    # The next chat is served as usual, and stored.
    answer = client(yak_url, seeded.alice_key).chat.completions.create(model="fake-model", messages=chat())
    assert answer.choices[0].message.content.startswith("You said:")
    assert len(turns(yak_app, database, "alice")) == stored_before + 1


def test_recall_failing_still_answers_without_a_block_and_counts_it(
        proxy_settings: Settings, database: Database, upstream: FakeOpenAIServer, seeded: Seeded) -> None:  # noqa: F811
    # An embedder nobody calibrated a relevance model for: recall refuses to guess, really failing.
    app = create_app(proxy_settings, database=database, embedder=HashingEmbedder(dimensions=256))
    with serve_in_thread(app) as url:
        answer = client(url, seeded.alice_key).chat.completions.create(model="fake-model", messages=chat())
        metrics = scrape(url)
    assert answer.choices[0].message.content == f"You said: {QUESTION}"
    assert upstream.chat_requests[-1].body["messages"] == chat()  # forwarded exactly as sent
    assert sample(metrics, 'yak_proxy_degradations_total{reason="recall_failed"}') == 1
    assert turns(app, database, "alice")[-1][:3] == (QUESTION, f"You said: {QUESTION}", [])


# --- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize(("body", "message"), [
    (b"{not json", "body: invalid JSON"),
    (b"[1, 2]", "body: must be a JSON object"),
    (b'{"model": "m"}', "messages: must be a non-empty list"),
    (b'{"model": "m", "messages": "hello"}', "messages: must be a non-empty list"),
    (b'{"model": "m", "messages": [{"content": "no role"}]}', "messages[0]: each message must be an object"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}', "stream: must be true or false"),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}', "body: invalid JSON (NaN"),
])
def test_malformed_bodies_get_a_clear_400_and_go_nowhere(
        yak_url: str, upstream: FakeOpenAIServer, seeded: Seeded, body: bytes, message: str) -> None:  # noqa: F811
    response = httpx.post(f"{yak_url}/v1/chat/completions", content=body,
                          headers={"Authorization": f"Bearer {seeded.alice_key}", "Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith(message) and response.json()["detail"].startswith(message)
    assert upstream.chat_requests == []


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                     max_leaves=12)
_MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", "", "x"]) | _JSON},
                                 optional={"content": _JSON | st.text(max_size=60)})
_BODY = st.fixed_dictionaries({}, optional={
    "model": _JSON, "messages": st.lists(_MESSAGE, max_size=4) | _JSON, "stream": st.booleans() | _JSON,
    "n": _JSON, "user": _JSON, "tools": _JSON, "stream_options": _JSON})


@hypothesis_settings(max_examples=60, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=_BODY | _JSON)
def test_fuzzed_bodies_never_get_a_5xx_and_store_only_finished_text_turns(
        yak_url: str, yak_app: FastAPI, seeded: Seeded, database: Database, body: object) -> None:  # noqa: F811
    before = len(turns(yak_app, database, "alice"))
    response = httpx.post(f"{yak_url}/v1/chat/completions", json=body, timeout=15,
                          headers={"Authorization": f"Bearer {seeded.alice_key}"})
    assert response.status_code in (200, 400), response.text
    stored = turns(yak_app, database, "alice")[before:]
    if response.status_code == 400:
        assert response.json()["error"]["message"] and not stored
    for user_message, assistant_message, _ in stored:
        # Only a text question with its complete answer is ever stored.
        assert assistant_message == f"You said: {user_message}"


def test_chats_get_16_mib_and_a_bigger_body_is_refused_with_413(
        yak_url: str, yak_app: FastAPI, upstream: FakeOpenAIServer, seeded: Seeded,  # noqa: F811
        database: Database) -> None:
    headers = {"Authorization": f"Bearer {seeded.alice_key}", "Content-Type": "application/json"}
    long_chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x " * (1024 * 1024)}]})
    assert httpx.post(f"{yak_url}/v1/chat/completions", content=long_chat, headers=headers, timeout=30).status_code == 200
    # Answered, but longer than POST /api/turns takes: not stored, and counted.
    assert len(turns(yak_app, database, "alice")) == 1
    assert sample(scrape(yak_url), 'yak_proxy_degradations_total{reason="turn_not_stored"}') == 1
    huge = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * (17 * 1024 * 1024)}]})
    response = httpx.post(f"{yak_url}/v1/chat/completions", content=huge, headers=headers, timeout=30)
    assert response.status_code == 413
    assert len(upstream.chat_requests) == 1


def test_multimodal_parts_and_tool_calls_pass_through_and_store_nothing(
        yak_url: str, yak_app: FastAPI, upstream: FakeOpenAIServer, seeded: Seeded,  # noqa: F811
        database: Database) -> None:
    alice = client(yak_url, seeded.alice_key)
    stored_before = len(turns(yak_app, database, "alice"))
    parts = [{"type": "text", "text": QUESTION},
             {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]
    answer = alice.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": parts}])
    assert answer.choices[0].message.content == f"You said: {QUESTION}"
    forwarded = upstream.chat_requests[-1].body["messages"]
    assert forwarded[-1] == {"role": "user", "content": parts} and BLOCK_OPEN in forwarded[-2]["content"]

    tools = [{"type": "function", "function": {"name": "open_locker", "parameters": {"type": "object"}}}]
    upstream.script(Reply.tool_call("open_locker", {"code": "1234"}))
    called = alice.chat.completions.create(model="fake-model", messages=chat(), tools=tools)
    assert called.choices[0].finish_reason == "tool_calls"
    assert called.choices[0].message.tool_calls[0].function.name == "open_locker"
    assert upstream.chat_requests[-1].body["tools"] == tools

    # The tool's result goes back to the model unchanged: the turn was recalled for already.
    follow_up = [*chat(), called.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": "call_fake_1", "content": "opened"}]
    upstream.script(Reply.text("Opened it."))
    alice.chat.completions.create(model="fake-model", messages=follow_up, tools=tools)
    assert upstream.chat_requests[-1].body["messages"] == follow_up
    assert len(turns(yak_app, database, "alice")) == stored_before


def test_no_secret_reaches_the_logs(yak_url: str, upstream: FakeOpenAIServer, seeded: Seeded,  # noqa: F811
                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    alice = client(yak_url, seeded.alice_key)
    alice.chat.completions.create(model="fake-model", messages=chat())
    upstream.script(Reply.status(500, {"error": {"message": "boom"}}), Reply.cut("a b c d", after=2))
    with pytest.raises(openai.InternalServerError):
        alice.chat.completions.create(model="fake-model", messages=chat())
    with pytest.raises(openai.APIError):
        list(alice.chat.completions.create(model="fake-model", messages=chat(), stream=True))
    text = caplog.text
    assert "upstream" in text  # the failures were logged...
    for secret in (UPSTREAM_KEY, seeded.alice_key, ADMIN_KEY):
        assert secret not in text  # ...without any key


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
