"""The memory proxy's Messages API (issue 34): the official ``anthropic`` client → ``/v1/messages`` of a
real ``yak proxy`` process → a loopback Messages API that records what it received.

The proxy runs as Claude Code would use it without Yak holding an Anthropic key: the client's own
key (``x-api-key``) goes upstream and the Yak key travels in ``X-Yak-Key``; one test configures
Yak's own upstream key instead, and the OpenAI protocol on the same port.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from yak_loopback.anthropic_server import FAKE_MODEL, Answer, FakeAnthropicServer
from yak_loopback.openai_server import FakeOpenAIServer
from yak_pipeline.core.memory_block import BLOCK_OPEN
from yak_pipeline.store.database import Database
from yak_pipeline_tests.api_fixtures import ADMIN_KEY, Seeded, seeded  # noqa: F401
from yak_pipeline_tests.loopback_fixtures import (
    anthropic_upstream,  # noqa: F401
    upstream,  # noqa: F401
)
from yak_pipeline_tests.pipeline_helpers import fetch_all
from yak_pipeline_tests.reliability_helpers import YakServe, wait_until, yak_env, yak_serve

ANTHROPIC_KEY = "sk-ant-client-own-key-77c1"
YAK_OWN_ANTHROPIC_KEY = "sk-ant-yak-own-key-3b9e"
QUESTION = "What is my locker code?"
CLAUDE_CODE_REMINDER = "<system-reminder>\nAs you answer the user's questions, you can use this context.\n</system-reminder>"


@pytest.fixture
def yak_proxy(db_url: str, anthropic_upstream: FakeAnthropicServer, seeded: Seeded,  # noqa: F811
              tmp_path: Path) -> Iterator[YakServe]:
    """``yak proxy`` on the test's database in front of the loopback Messages API (no Anthropic key of its own)."""
    env = yak_env(db_url, tmp_path / "home", YAK_UPSTREAM_ANTHROPIC_BASE_URL=anthropic_upstream.base_url,
                  YAK_ADMIN_API_KEY=ADMIN_KEY, YAK_PROXY_RECALL_THRESHOLD="0.1")
    with yak_serve(env, tmp_path, command="proxy") as server:
        yield server


def claude(url: str, yak_key: str | None, *, api_key: str = ANTHROPIC_KEY) -> anthropic.Anthropic:
    """The official client as Claude Code is set up: its own key, the Yak key in X-Yak-Key (no retries)."""
    headers = {"X-Yak-Key": yak_key} if yak_key else {}
    return anthropic.Anthropic(base_url=url, api_key=api_key, default_headers=headers, max_retries=0, timeout=15)


def conversation(question: str = QUESTION) -> list[dict]:
    """History, then the question (with a Claude Code reminder block before it, as Claude Code sends)."""
    return [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
            {"role": "user", "content": [{"type": "text", "text": CLAUDE_CODE_REMINDER},
                                         {"type": "text", "text": question}]}]


def upstream_key(headers: dict[str, str]) -> str | None:
    """The API key a request carried: ``x-api-key``, or the bearer token (the SDK sends either)."""
    return headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ") or None


def exchanges(database: Database, user_id: str, question: str) -> list[str]:
    """The user's stored exchanges whose user side is ``question``."""
    return [r[0] for r in fetch_all(database, "SELECT content FROM memories WHERE user_id = %s AND content LIKE %s",
                                    (user_id, f"User: {question}%"))]


def stored_once(database: Database, user_id: str, question: str) -> str:
    """The one exchange stored for ``question``: waits for the proxy process to store it, then checks no
    second one follows."""
    wait_until(lambda: exchanges(database, user_id, question), timeout=15, what="the turn to be stored")
    time.sleep(0.3)
    (content,) = exchanges(database, user_id, question)
    return content


# --- the loop ----------------------------------------------------------------------------------

def test_the_block_joins_system_in_the_clients_form_and_the_turn_is_stored_once(
        yak_proxy: YakServe, anthropic_upstream: FakeAnthropicServer, seeded: Seeded,  # noqa: F811
        database: Database) -> None:
    alice = claude(yak_proxy.url, seeded.alice_key)
    answer = alice.messages.create(model=FAKE_MODEL, max_tokens=100, system="You are terse.",
                                   messages=conversation(), extra_headers={"anthropic-beta": "fake-beta-2025"})
    assert answer.content[0].text == f"You said: {QUESTION}"
    assert answer.id.startswith("msg_fake_") and answer.stop_reason == "end_turn"  # the upstream's own body

    (received,) = anthropic_upstream.messages_received
    system = received.body["system"]
    assert system.startswith("You are terse.\n\n" + BLOCK_OPEN)
    assert seeded.alice.secret in system and seeded.bob.secret not in system
    # Everything but system goes as the client sent it, reminder block included.
    assert received.body["messages"] == conversation()
    assert {k: v for k, v in received.body.items() if k != "system"} == {
        "model": FAKE_MODEL, "max_tokens": 100, "messages": conversation()}
    # The client's own key and anthropic-* headers go upstream; the Yak key never does.
    assert upstream_key(received.headers) == ANTHROPIC_KEY
    assert received.headers["anthropic-version"] and received.headers["anthropic-beta"] == "fake-beta-2025"
    assert seeded.alice_key not in json.dumps(received.headers) and "x-yak-key" not in received.headers

    # What the person typed is stored, not Claude Code's reminder.
    assert stored_once(database, "alice", QUESTION) == f"User: {QUESTION}\nAssistant: You said: {QUESTION}"

    # A system of blocks keeps its blocks (cache_control included) and gets the block as the last one.
    cached = [{"type": "text", "text": "Be kind.", "cache_control": {"type": "ephemeral"}}]
    alice.messages.create(model=FAKE_MODEL, max_tokens=100, system=cached, messages=conversation("And my bike?"))
    system = anthropic_upstream.messages_received[-1].body["system"]
    assert system[0] == cached[0] and len(system) == 2
    assert system[1]["type"] == "text" and system[1]["text"].startswith(BLOCK_OPEN)
    # No system: the block is the system.
    alice.messages.create(model=FAKE_MODEL, max_tokens=100, messages=conversation("locker code again?"))
    assert anthropic_upstream.messages_received[-1].body["system"].startswith(BLOCK_OPEN)


def test_another_users_memories_never_appear(yak_proxy: YakServe, anthropic_upstream: FakeAnthropicServer,
                                            seeded: Seeded, database: Database) -> None:  # noqa: F811
    # Bob's key with Alice named in metadata: still Bob's memories (a user key ignores the body).
    claude(yak_proxy.url, seeded.bob_key).messages.create(
        model=FAKE_MODEL, max_tokens=100, messages=conversation(), metadata={"user_id": "alice"})
    system = anthropic_upstream.messages_received[-1].body["system"]
    assert seeded.bob.secret in system and seeded.alice.secret not in system
    stored_once(database, "bob", QUESTION)
    assert exchanges(database, "alice", QUESTION) == []
    # An admin key names the user in metadata.user_id, and must.
    admin = claude(yak_proxy.url, ADMIN_KEY)
    admin.messages.create(model=FAKE_MODEL, max_tokens=100, messages=conversation(), metadata={"user_id": "alice"})
    system = anthropic_upstream.messages_received[-1].body["system"]
    assert seeded.alice.secret in system and seeded.bob.secret not in system
    with pytest.raises(anthropic.BadRequestError) as refused:
        admin.messages.create(model=FAKE_MODEL, max_tokens=100, messages=conversation())
    assert "metadata.user_id" in refused.value.message
    assert refused.value.body["type"] == "error" and refused.value.body["error"]["type"] == "invalid_request_error"


def test_a_stream_arrives_event_for_event_and_its_answer_is_stored_once(
        yak_proxy: YakServe, anthropic_upstream: FakeAnthropicServer, seeded: Seeded,  # noqa: F811
        database: Database) -> None:
    alice = claude(yak_proxy.url, seeded.alice_key)
    events = list(alice.messages.create(model=FAKE_MODEL, max_tokens=100, messages=conversation(), stream=True))
    sent = anthropic_upstream.streams_sent[-1].decode()
    sent_events = [json.loads(line.removeprefix("data: ")) for line in sent.splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in sent_events][:2] == ["message_start", "ping"]
    # The SDK reads every event the upstream sent, as sent (it skips pings itself).
    sent_events = [e for e in sent_events if e["type"] != "ping"]
    assert [e.type for e in events] == [e["type"] for e in sent_events]
    assert [e.type for e in events][-2:] == ["message_delta", "message_stop"]
    assert [e.model_dump(exclude_unset=True) for e in events] == sent_events
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == f"You said: {QUESTION}"
    assert BLOCK_OPEN in anthropic_upstream.messages_received[-1].body["system"]
    stored_once(database, "alice", QUESTION)

    # Byte for byte, as a raw client reads it.
    body = {"model": FAKE_MODEL, "max_tokens": 100, "stream": True, "messages": conversation("Byte for byte?")}
    headers = {"x-api-key": ANTHROPIC_KEY, "X-Yak-Key": seeded.alice_key, "anthropic-version": "2023-06-01"}
    with httpx.stream("POST", f"{yak_proxy.url}/v1/messages", json=body, headers=headers, timeout=15) as response:
        relayed = b"".join(response.iter_bytes())
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["request-id"].startswith("req_fake_")
    assert relayed == anthropic_upstream.streams_sent[-1]
    stored_once(database, "alice", "Byte for byte?")


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_use_round_trip_passes_through_and_stores_the_prompt_and_final_answer_once(
        yak_proxy: YakServe, anthropic_upstream: FakeAnthropicServer, seeded: Seeded,  # noqa: F811
        database: Database, stream: bool) -> None:
    alice = claude(yak_proxy.url, seeded.alice_key)
    tools = [{"name": "get_weather", "description": "The weather in a city.",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    question = "What is the weather in Paris?"
    anthropic_upstream.script(Answer.tool_call("get_weather", {"city": "Paris", "unit": "C"}))
    messages = [{"role": "user", "content": question}]

    def ask() -> anthropic.types.Message:
        if not stream:
            return alice.messages.create(model=FAKE_MODEL, max_tokens=100, tools=tools, messages=messages)
        with alice.messages.stream(model=FAKE_MODEL, max_tokens=100, tools=tools, messages=messages) as events:
            return events.get_final_message()

    first = ask()
    assert first.stop_reason == "tool_use"
    call = first.content[1]
    assert (call.type, call.name, call.input) == ("tool_use", "get_weather", {"city": "Paris", "unit": "C"})
    time.sleep(0.3)
    assert exchanges(database, "alice", question) == []  # the model is not done: nothing stored

    messages += [{"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                               "content": "18 degrees and sunny"}, {"type": "text",
                                                                                     "text": CLAUDE_CODE_REMINDER}]}]
    final = ask()
    assert final.content[0].text == "The tool said: 18 degrees and sunny"

    first_sent, second_sent = anthropic_upstream.messages_received[-2:]
    # The tool blocks went upstream untouched, and the loop kept the same memory block in system.
    assert second_sent.body["messages"] == messages and second_sent.body["tools"] == tools
    assert BLOCK_OPEN in first_sent.body["system"] and second_sent.body["system"] == first_sent.body["system"]
    # One turn: the prompt the person typed and the loop's final answer; the tool result is not their words.
    assert stored_once(database, "alice", question) == f"User: {question}\nAssistant: The tool said: 18 degrees and sunny"
    assert not fetch_all(database, "SELECT 1 FROM memories WHERE content LIKE '%%18 degrees and sunny%%' "
                                   "AND content NOT LIKE %s", (f"User: {question}%",))


def test_forget_in_chat_is_answered_by_yak_and_never_goes_upstream(
        yak_proxy: YakServe, anthropic_upstream: FakeAnthropicServer, seeded: Seeded,  # noqa: F811
        database: Database) -> None:
    alice = claude(yak_proxy.url, seeded.alice_key)
    asked = alice.messages.create(model=FAKE_MODEL, max_tokens=100,
                                  messages=[{"role": "user", "content": f"/forget {seeded.alice.secret}"}])
    text = asked.content[0].text
    assert "contain that phrase" in text and "/forget confirm" in text
    token = text.split("/forget confirm ", 1)[1].split()[0]
    with alice.messages.stream(model=FAKE_MODEL, max_tokens=100,
                               messages=[{"role": "user", "content": f"/forget confirm {token}"}]) as stream:
        done = stream.get_final_message()
    assert done.content[0].text.startswith("Forgotten:")
    assert anthropic_upstream.messages_received == []
    assert not fetch_all(database, "SELECT 1 FROM memories WHERE user_id = 'alice' AND content LIKE %s",
                         (f"%{seeded.alice.secret}%",))
    assert fetch_all(database, "SELECT 1 FROM memories WHERE user_id = 'bob'")  # Bob's are untouched


def test_errors_keep_anthropics_shape_and_store_nothing(
        yak_proxy: YakServe, anthropic_upstream: FakeAnthropicServer, seeded: Seeded,  # noqa: F811
        database: Database) -> None:
    for key, said in ((None, "missing Yak API key"), ("yak-wrong-key", "invalid Yak API key")):
        with pytest.raises(anthropic.AuthenticationError) as refused:
            claude(yak_proxy.url, key).messages.create(model=FAKE_MODEL, max_tokens=10, messages=conversation())
        assert said in refused.value.message
        assert refused.value.body["error"]["type"] == "authentication_error"
    alice = claude(yak_proxy.url, seeded.alice_key)
    # The upstream's own error comes back as it was sent.
    anthropic_upstream.script(Answer.error(529, "overloaded_error", "Overloaded"))
    with pytest.raises(anthropic.APIStatusError) as overloaded:
        alice.messages.create(model=FAKE_MODEL, max_tokens=10, messages=conversation("overloaded?"))
    assert overloaded.value.status_code == 529
    assert overloaded.value.body == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    # A stream cut before message_stop ends in an error event the SDK raises; nothing is stored.
    anthropic_upstream.script(Answer(text="half an answer", cut_after_events=4))
    with pytest.raises(anthropic.APIStatusError) as cut:
        with alice.messages.stream(model=FAKE_MODEL, max_tokens=10, messages=conversation("cut?")) as stream:
            stream.get_final_message()
    assert "without finishing" in str(cut.value)
    # A body that is not a Messages request: a one-line 400 in Anthropic's shape, nothing upstream.
    before = len(anthropic_upstream.received)
    bad = httpx.post(f"{yak_proxy.url}/v1/messages", content=b'{"model": "x", "messages": []}',
                     headers={"x-api-key": ANTHROPIC_KEY, "X-Yak-Key": seeded.alice_key}, timeout=15)
    assert bad.status_code == 400
    assert bad.json()["type"] == "error" and bad.json()["error"] == {
        "type": "invalid_request_error", "message": "messages: must be a non-empty list of messages"}
    assert len(anthropic_upstream.received) == before
    time.sleep(0.3)
    assert exchanges(database, "alice", "overloaded?") == [] and exchanges(database, "alice", "cut?") == []


def test_yaks_own_upstream_key_and_both_protocols_on_one_port(
        db_url: str, anthropic_upstream: FakeAnthropicServer, upstream: FakeOpenAIServer,  # noqa: F811
        seeded: Seeded, database: Database, tmp_path: Path) -> None:  # noqa: F811
    env = yak_env(db_url, tmp_path / "home", YAK_UPSTREAM_ANTHROPIC_BASE_URL=anthropic_upstream.base_url,
                  YAK_UPSTREAM_ANTHROPIC_API_KEY=YAK_OWN_ANTHROPIC_KEY, YAK_UPSTREAM_BASE_URL=upstream.base_url,
                  YAK_ADMIN_API_KEY=ADMIN_KEY, YAK_PROXY_RECALL_THRESHOLD="0.1")
    with yak_serve(env, tmp_path, command="proxy") as server:
        # The client's one key is the Yak key; Yak's own key goes upstream.
        alice = claude(server.url, None, api_key=seeded.alice_key)
        assert alice.messages.create(model=FAKE_MODEL, max_tokens=10,
                                     messages=conversation()).content[0].text == f"You said: {QUESTION}"
        received = anthropic_upstream.messages_received[-1]
        assert upstream_key(received.headers) == YAK_OWN_ANTHROPIC_KEY
        assert seeded.alice_key not in json.dumps(received.headers)
        assert [m.id for m in alice.models.list()] == [FAKE_MODEL]
        assert upstream_key(anthropic_upstream.received[-1].headers) == YAK_OWN_ANTHROPIC_KEY
        assert alice.messages.count_tokens(model=FAKE_MODEL, messages=conversation()).input_tokens > 0
        # The OpenAI protocol on the same port, to its own upstream.
        chat = openai.OpenAI(base_url=f"{server.url}/v1", api_key=seeded.alice_key, max_retries=0, timeout=15)
        reply = chat.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hello?"}])
        assert reply.choices[0].message.content == "You said: hello?"
        assert [m.id for m in chat.models.list()] == ["fake-model"]
    assert YAK_OWN_ANTHROPIC_KEY not in server.logs() and seeded.alice_key not in server.logs()
    stored_once(database, "alice", QUESTION)
