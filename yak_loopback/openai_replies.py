"""What the loopback OpenAI-protocol server answers (:mod:`yak_loopback.openai_server`): scripted
replies, the default repliers, and its deterministic embeddings.

Replies can be good JSON, raw text (broken JSON), HTTP errors, slow replies, dropped connections,
tool calls and streams cut off in the middle (:class:`Reply`). The default replier,
:func:`rules_replier`, answers Yak's own prompts like a well-behaved model would (it runs the rules
provider on the prompt's JSON payload); :func:`chat_replier` answers any chat instead, as a model
behind the memory proxy would.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from yak_pipeline.llm.prompts import parse_payload
from yak_pipeline.llm.rules import RulesProvider

DEFAULT_EMBEDDING_DIMENSIONS = 768


@dataclass(frozen=True)
class Reply:
    """One scripted answer of the fake server; build it with the class-method constructors.

    ``Reply.json(obj)`` / ``Reply.text(s)`` answer 200 with that assistant content,
    ``Reply.status(code, body)`` an HTTP error, ``Reply.delay(seconds, then)`` answers ``then``
    (default: the default replier's answer) after a pause, ``Reply.close()`` drops the connection
    without answering. ``reply.usage(prompt, completion)`` returns a copy that reports token usage;
    ``reply.slowly(seconds)`` one whose stream pauses that long before each event (a model that is
    still writing, for a client that hangs up on it).
    """

    kind: Literal["content", "status", "close", "delay", "raw", "cut"]
    content: str | None = None
    status_code: int = 200
    body: Any = None
    seconds: float = 0.0
    then: Reply | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str = "stop"
    headers: tuple[tuple[str, str], ...] = ()
    tool_calls: tuple[dict[str, Any], ...] = ()
    cut_after: int = 0
    event_delay: float = 0.0

    @classmethod
    def json(cls, obj: Any, *, finish_reason: str = "stop") -> Reply:
        """Assistant content ``json.dumps(obj)``."""
        return cls(kind="content", content=json.dumps(obj), finish_reason=finish_reason)

    @classmethod
    def text(cls, content: str, *, finish_reason: str = "stop") -> Reply:
        """Raw assistant content, e.g. truncated or non-JSON text."""
        return cls(kind="content", content=content, finish_reason=finish_reason)

    @classmethod
    def status(cls, code: int, body: Any = None, *, headers: dict[str, str] | None = None) -> Reply:
        """An HTTP error answer with an OpenAI-style error body (or ``body`` as given)."""
        if body is None:
            body = {"error": {"message": f"fake server error {code}", "type": "fake_error", "code": code}}
        return cls(kind="status", status_code=code, body=body, headers=tuple((headers or {}).items()))

    @classmethod
    def raw(cls, body: Any, *, code: int = 200) -> Reply:
        """Any JSON body as the whole HTTP response, e.g. one that is not a chat completion."""
        return cls(kind="raw", status_code=code, body=body)

    @classmethod
    def delay(cls, seconds: float, then: Reply | None = None) -> Reply:
        """Answer ``then`` (default: the default replier's answer) after ``seconds``."""
        return cls(kind="delay", seconds=seconds, then=then)

    @classmethod
    def tool_call(cls, name: str, arguments: dict[str, Any]) -> Reply:
        """An assistant message that calls tool ``name`` instead of answering (finish reason ``tool_calls``)."""
        call = {"id": "call_fake_1", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
        return cls(kind="content", content=None, finish_reason="tool_calls", tool_calls=(call,))

    @classmethod
    def cut(cls, content: str, *, after: int) -> Reply:
        """Stream ``content`` but drop the connection after ``after`` events, mid-body (a killed server);
        a request without ``stream`` just sees the connection close."""
        return cls(kind="cut", content=content, cut_after=after)

    @classmethod
    def close(cls) -> Reply:
        """Close the connection without sending any response."""
        return cls(kind="close")

    def usage(self, prompt: int, completion: int) -> Reply:
        """A copy of this reply that reports ``prompt`` and ``completion`` tokens."""
        return replace(self, prompt_tokens=prompt, completion_tokens=completion)

    def slowly(self, seconds: float) -> Reply:
        """A copy of this reply whose stream waits ``seconds`` before each event."""
        return replace(self, event_delay=seconds)


@dataclass(frozen=True)
class RecordedRequest:
    """One request the server received: method, path, parsed JSON body (or ``None``) and headers."""

    method: str
    path: str
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


Replier = Callable[[dict[str, Any]], Reply]


def rules_replier(request: dict[str, Any]) -> Reply:
    """Answer one of Yak's prompts correctly, by running the rules provider on its JSON payload.

    A request not built by Yak's prompts gets a 400, like a real server given a bad request.
    """
    messages = request.get("messages") or []
    user_messages = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    if not user_messages or not isinstance(user_messages[-1], str):
        return Reply.status(400, {"error": {"message": "no user message", "type": "invalid_request_error"}})
    try:
        task, payload = parse_payload(user_messages[-1])
    except ValueError as exc:
        return Reply.status(400, {"error": {"message": f"fake server: {exc}", "type": "invalid_request_error"}})
    rules = RulesProvider()
    if task == "distil":
        result = rules.distill(payload["exchange"])
        answer: dict[str, Any] = {"content": result.content, "confidence": result.confidence, "tier": result.tier,
                                  "type": result.memory_type}
    elif task == "consolidate":
        answer = {"content": rules.consolidate(payload["older"], payload["newer"]).content}
    elif task == "conflict":
        answer = {"score": rules.conflict_score(payload["a"], payload["b"]).score}
    else:
        answer = {"score": rules.relevance_score(payload["memory"], payload["turn"]).score}
    # Rough token counts, so usage reporting is exercised the way a real server reports it.
    prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages if isinstance(m, dict))
    return Reply.json(answer).usage(prompt_tokens, len(json.dumps(answer).split()))


def chat_replier(request: dict[str, Any], *, tag: str = "") -> Reply:
    """Answer any chat: ``You said: <the last user message's text>`` (so tests can tell answers apart),
    then `` (<tag>)`` when given (a benchmark's run: its turns are new, not ones stored before)."""
    messages = [m for m in request.get("messages") or [] if isinstance(m, dict)]
    last = next((m.get("content") for m in reversed(messages) if m.get("role") == "user"), "")
    if isinstance(last, list):
        last = " ".join(p["text"] for p in last if isinstance(p, dict) and p.get("type") == "text")
    prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)
    answer = f"You said: {last}" + (f" ({tag})" if tag else "")
    return Reply.text(answer).usage(prompt_tokens, len(answer.split()))


def fake_embedding(text: str, dimensions: int) -> list[float]:
    """A deterministic unit vector for ``text``: Gaussian components seeded by its SHA-256."""
    seed = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")
    rng = random.Random(seed)
    vector = [rng.gauss(0.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [v / norm for v in vector]
