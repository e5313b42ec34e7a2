"""The memory proxy stores each turn after its answer (issue 13): the turn writer, its batches and
back-pressure, the document model loaded at start, and warmth from a proxied turn.

The same live Yak and loopback upstream as test_proxy.py (yak_pipeline_tests.proxy_fixtures).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from contextlib import ExitStack
from datetime import UTC, datetime

import httpx
import pytest
from fastapi import FastAPI

from yak_loopback.anthropic_server import FakeAnthropicServer
from yak_loopback.openai_replies import Reply
from yak_loopback.openai_server import FakeOpenAIServer
from yak_pipeline.api.app import create_app, create_proxy_app
from yak_pipeline.defs.scores.assets import warmth
from yak_pipeline.embeddings.openai_embedder import OpenAIEmbedder
from yak_pipeline.services.turn_writer import WRITER_NICENESS, TurnWriter
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline_tests.api_fixtures import Seeded, api_settings, seeded, serve_in_thread  # noqa: F401 - fixtures among them
from yak_pipeline_tests.loopback_fixtures import anthropic_upstream  # noqa: F401 - fixtures among them
from yak_pipeline_tests.pipeline_helpers import fetch_all, fetch_one, new_instance, pipeline_resources, run_partition
from yak_pipeline_tests.proxy_fixtures import (  # noqa: F401 - fixtures among them
    QUESTION,
    chat,
    client,
    proxy_settings,
    sample,
    scrape,
    settle,
    stored_turns,
    turns,
    yak_app,
    yak_url,
)


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
    with local._DOCUMENT_LOCK, serve_in_thread(app) as url:  # the load waits for this lock
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        proxy = app.state.services.proxy
        assert not proxy.documents_warm.is_set()
    assert proxy.documents_warm.wait(120)
    # The exported model (embeddings.document_model), or sentence-transformers where it is unavailable.
    assert local._DOCUMENT_MODEL or local._MODEL is not None


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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread CPU priority is Linux's")
def test_the_turn_writer_stores_at_a_lower_cpu_priority_than_the_chats() -> None:
    """Its model calls would otherwise take a core from the chats' recall (services.turn_writer)."""
    def niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    seen: list[int] = []
    writer = TurnWriter(lambda batch: seen.append(niceness()))
    assert writer.submit(1) and writer.wait(timeout=10)
    assert seen == [max(niceness(), WRITER_NICENESS)]  # never above the chats' priority
    writer.store_now([2])  # a chat that stores its own turn keeps the chat's priority
    assert seen[-1] == niceness()


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
