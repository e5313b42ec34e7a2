"""The memory proxy in OpenAI's protocol (issue 13): ``POST /v1/chat/completions`` and ``GET /v1/models``.

A client points its OpenAI base URL at Yak and its API key at a Yak key. Only the wire protocol
lives here; the memory flow is :class:`~yak_pipeline.services.proxy.MemoryProxy`'s, the same for
both protocols. In OpenAI's terms:

- the user is the key's; an admin key names one in the body's ``user``;
- the last message is the user's words when it is a user message (its text parts: image or audio
  parts make the turn one Yak does not store, as do ``n`` > 1 choices); a forget command there is
  answered by Yak as a chat completion (streamed if asked) and never goes upstream;
- recall runs on the last user message (and the one before a short follow-up,
  :func:`core.conversation_query.recall_queries`), and the block goes in as its own system message
  before that message (:func:`core.memory_block.insert_memory_block`); a chat that does not end
  with a user message (a tool result going back) goes through unchanged;
- the chat goes upstream (``YAK_UPSTREAM_BASE_URL``, ``YAK_UPSTREAM_API_KEY``; never the client's
  Yak key) with every other field as the client sent it, and the answer comes back byte for byte:
  the same body, or the same server-sent events with their finish reasons and usage;
- a stream that breaks off ends in an error event that OpenAI clients raise; an answer with tool
  calls or without text is passed on and not stored.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import httpx

from yak_pipeline.core.conversation_query import recall_queries
from yak_pipeline.core.memory_block import insert_memory_block
from yak_pipeline.services.proxy import MemoryProxy, resolve_named_user
from yak_pipeline.services.proxy_exchange import (
    ChatTurn,
    EventLines,
    ProxyAnswer,
    ProxyError,
    ProxyStream,
    upstream_error,
)
from yak_pipeline.settings import Settings

_DONE_RE: Final = re.compile(rb"data:[ \t]*\[DONE\]")


# --- reading the chat ------------------------------------------------------------------------

def _text_of(content: object) -> tuple[str | None, bool]:
    """A user message's text and whether that is all of it (image or audio parts are not text)."""
    if isinstance(content, str):
        return content, True
    if not isinstance(content, list):
        return None, False
    texts, text_only = [], True
    for part in content:
        if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            text_only = False
    return ("\n".join(texts) if texts else None), text_only


def _refuse_constant(name: str) -> float:
    # Python reads NaN and Infinity, JSON has neither: forwarded, they would break a strict upstream.
    raise ValueError(f"{name} is not a JSON number")


def parse_chat_request(raw: bytes, *, follow_up_words: int = 0) -> tuple[dict[str, Any], ChatTurn]:
    """A chat-completions body, checked as far as Yak reads it (everything else passes through), and what
    the memory flow reads of it: the last message's text when the chat ends with a user message (else
    nothing to forget, recall for or store), stored when the turn can be at full fidelity (a text-only
    last user message, one choice). Raises :class:`ProxyError` (400) saying what is wrong."""
    try:
        body = json.loads(raw, parse_constant=_refuse_constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProxyError(400, f"body: invalid JSON ({exc})") from None
    except ValueError as exc:
        raise ProxyError(400, f"body: invalid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise ProxyError(400, "body: must be a JSON object with 'model' and 'messages'")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ProxyError(400, "messages: must be a non-empty list of messages", param="messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ProxyError(400, f"messages[{index}]: each message must be an object with a 'role' string",
                             param=f"messages[{index}]")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise ProxyError(400, "stream: must be true or false", param="stream")
    last = messages[-1]
    text, text_only = _text_of(last.get("content")) if last["role"] == "user" else (None, False)
    choices = body.get("n")
    storable = text is not None and text_only and choices in (None, 1)
    recall_texts: list[str] = []
    if text is not None:
        earlier = [_text_of(m.get("content"))[0] for m in messages[:-1] if m["role"] == "user"]
        recall_texts = recall_queries([t for t in earlier if t is not None] + [text], follow_up_words=follow_up_words)
    return body, ChatTurn(stream=stream, forget_text=text, recall_texts=tuple(recall_texts),
                          turn_text=text if storable else None)


def resolve_user(key_user: str | None, body: Mapping[str, Any]) -> str:
    """Whose memories a chat uses: the key's user; for an admin key, the body's ``user`` (400 without one)."""
    return resolve_named_user(key_user, body.get("user"), field="user")


# --- Yak's own answers (forget commands) -----------------------------------------------------

def yak_answer(text: str, *, body: Mapping[str, Any], stream: bool) -> ProxyAnswer | ProxyStream:
    """``text`` as the assistant's answer in the chat-completions protocol, streamed if asked."""
    model = body.get("model") if isinstance(body.get("model"), str) else "yak"
    common = {"id": f"chatcmpl-yak-{uuid.uuid4().hex}", "created": int(time.time()), "model": model,
              "system_fingerprint": "yak"}
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    if not stream:
        completion = {**common, "object": "chat.completion", "usage": usage, "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop", "logprobs": None}]}
        return ProxyAnswer(200, json.dumps(completion).encode("utf-8"), "application/json")
    chunk = {**common, "object": "chat.completion.chunk"}
    events = [
        {**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": None}]},
        {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    options = body.get("stream_options")
    if isinstance(options, Mapping) and options.get("include_usage"):
        events.append({**chunk, "choices": [], "usage": usage})

    async def relay() -> AsyncIterator[bytes]:
        for event in events:
            yield f"data: {json.dumps(event)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    return ProxyStream(relay())


# --- reading the upstream's answer -----------------------------------------------------------

@dataclass
class StreamedAnswer(EventLines):
    """The answer carried by a stream of chat-completion chunks, gathered as the bytes go by."""

    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    tool_calls: bool = False
    error: bool = False

    def read_line(self, line: bytes) -> None:
        """Take in one ``data:`` line: the first choice's text, tool calls, finish reason, or an error."""
        if not line.startswith(b"data:"):
            return
        data = line[5:].strip()
        if data == b"[DONE]":
            return
        try:
            event = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError):
            self.error = True
            return
        if not isinstance(event, dict):
            return
        if event.get("error"):
            self.error = True
        for choice in event.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if isinstance(delta, dict):
                if isinstance(delta.get("content"), str):
                    self.text.append(delta["content"])
                if delta.get("tool_calls") or delta.get("function_call"):
                    self.tool_calls = True
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])

    @staticmethod
    def hand_over_at(chunk: bytes) -> int | None:
        """Where ``[DONE]`` begins: it goes out after the turn is handed over."""
        done = _DONE_RE.search(chunk)
        return None if done is None else done.start()

    @staticmethod
    def cut_event(message: str) -> bytes:
        """A server-sent event that makes OpenAI clients raise instead of ending quietly (how OpenAI
        reports mid-stream errors)."""
        error = {"error": {"message": message, "type": "upstream_error", "param": None, "code": "upstream_cut"}}
        return f"data: {json.dumps(error)}\n\n".encode()

    @property
    def complete(self) -> bool:
        """The stream said it finished (a finish reason) and carried no error."""
        return self.finish_reason is not None and not self.error

    @property
    def answer(self) -> str | None:
        """The text to store: None when the model called tools instead of answering."""
        return None if self.tool_calls else "".join(self.text)

    @property
    def error_relayed(self) -> bool:
        """Never: Yak adds its own error event even after one of the upstream's."""
        return False


def answer_of_completion(body: object) -> tuple[str | None, bool]:
    """The first choice's text of a ``chat.completion`` body and whether the body is one at all."""
    if not isinstance(body, dict) or not isinstance(body.get("choices"), list):
        return None, False
    choices = body["choices"]
    if not choices or not isinstance(choices[0], dict):
        return None, True
    message = choices[0].get("message") or {}
    if not isinstance(message, dict) or message.get("tool_calls") or message.get("function_call"):
        return None, True
    content = message.get("content")
    return (content if isinstance(content, str) and content else None), True


# --- the chat through the memory flow --------------------------------------------------------

def openai_upstream(settings: Settings) -> tuple[str, dict[str, str]]:
    """The upstream's base URL and the headers every call to it carries (Yak's upstream key, never the client's)."""
    base_url, key = settings.resolved_upstream
    if base_url is None:
        raise ProxyError(503, "the memory proxy has no upstream model server: set YAK_UPSTREAM_BASE_URL",
                         error_type="server_error", code="no_upstream")
    headers = {"Content-Type": "application/json"}
    if key is not None and key.get_secret_value():
        headers["Authorization"] = f"Bearer {key.get_secret_value()}"
    return base_url.rstrip("/"), headers


@dataclass(frozen=True)
class OpenAIChat:
    """A chat completion as the memory flow carries it (:class:`~yak_pipeline.services.proxy_exchange.ProxiedChat`)."""

    body: dict[str, Any]
    user_id: str
    turn: ChatTurn
    settings: Settings

    def yak_answer(self, text: str) -> ProxyAnswer | ProxyStream:
        """Yak's ``text`` as a chat completion."""
        return yak_answer(text, body=self.body, stream=self.turn.stream)

    def upstream(self) -> tuple[str, Mapping[str, str]]:
        """``…/chat/completions`` of the upstream (503 without one)."""
        base_url, headers = openai_upstream(self.settings)
        return f"{base_url}/chat/completions", headers

    def forwarded(self, block: str) -> bytes:
        """The body with the block as a system message before the last user message; only the messages change."""
        return json.dumps({**self.body, "messages": insert_memory_block(self.body["messages"], block)}).encode("utf-8")

    def answer_stream(self) -> StreamedAnswer:
        """A reader of chat-completion chunks."""
        return StreamedAnswer()

    def answer_of(self, body: object) -> tuple[str | None, bool]:
        """The completion's text (:func:`answer_of_completion`)."""
        return answer_of_completion(body)

    def refused(self, status_code: int, content: bytes, headers: httpx.Headers) -> ProxyAnswer:
        """Raised as the upstream's status with its message said clearly."""
        raise upstream_error(status_code, content)

    def not_an_answer(self) -> ProxyError:
        """502: the body is not a chat completion."""
        return ProxyError(502, "the upstream model server answered with something that is not a chat completion",
                          error_type="upstream_error", code="upstream_garbage")

    def passed_back(self, headers: httpx.Headers) -> dict[str, str]:
        """None of the upstream's headers: the body is the answer."""
        return {}


async def chat_completions(proxy: MemoryProxy, raw: bytes, *, key_user: str | None, actor: str,
                           read_only: bool = False) -> ProxyAnswer | ProxyStream:
    """One chat completion through the proxy (module docstring); raises :class:`ProxyError` for the client."""
    body, turn = parse_chat_request(raw, follow_up_words=proxy.settings.proxy_follow_up_words)
    chat = OpenAIChat(body, resolve_user(key_user, body), turn, proxy.settings)
    return await proxy.converse(chat, actor=actor, read_only=read_only)


async def list_models(proxy: MemoryProxy) -> ProxyAnswer:
    """``GET /models`` of the upstream, passed through (its errors said like a chat's)."""
    base_url, headers = openai_upstream(proxy.settings)
    response = await proxy.pass_through("GET", f"{base_url}/models", headers=headers)
    if response.status_code >= 400:
        raise upstream_error(response.status_code, response.content)
    return ProxyAnswer(response.status_code, response.content, response.headers.get("content-type", "application/json"))
