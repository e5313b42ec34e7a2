"""The memory proxy when things go wrong (issue 13): upstream errors, cut streams, a client that hangs
up, recall failing, malformed and fuzzed bodies, size limits, what never reaches the logs, and
``yak proxy`` on its own.

The same live Yak and loopback upstream as test_proxy.py (yak_pipeline_tests.proxy_fixtures).
"""

from __future__ import annotations

import json
import logging
import time

import httpx
import openai
import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from yak_loopback.openai_replies import Reply
from yak_loopback.openai_server import FakeOpenAIServer
from yak_pipeline.api.app import create_app
from yak_pipeline.core.memory_block import BLOCK_OPEN
from yak_pipeline.embeddings.hashing import HashingEmbedder
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline_tests.api_fixtures import (  # noqa: F401 - fixtures among them
    ADMIN_KEY,
    Seeded,
    api_settings,
    seeded,
    serve_in_thread,
)
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
