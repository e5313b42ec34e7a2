"""A loopback server that speaks Anthropic's Messages API, for the memory proxy's ``/v1/messages`` tests
and benchmarks.

It answers ``POST /v1/messages`` (whole or streamed), ``POST /v1/messages/count_tokens`` and
``GET /v1/models``, records every request (path, headers, JSON body) and every stream it sent, byte
for byte. By default a message is answered ``You said: <the last user message's last text block>``; a last user message
of tool results is answered ``The tool said: <the results>``; :meth:`FakeAnthropicServer.script`
queues other replies: a tool call, an error status, a stream cut midway.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAKE_MODEL = "claude-fake-1"


@dataclass(frozen=True)
class Answer:
    """A scripted reply: a text, a tool call (``tool`` with its ``tool_input``), an error status, or a cut stream."""

    text: str | None = None
    tool: str | None = None
    tool_input: dict[str, Any] = field(default_factory=dict)
    status: int | None = None
    error_body: Any = None
    cut_after_events: int | None = None

    @classmethod
    def tool_call(cls, name: str, arguments: dict[str, Any], *, text: str = "Let me look that up.") -> Answer:
        """Some text, then a call of tool ``name`` (stop reason ``tool_use``)."""
        return cls(text=text, tool=name, tool_input=arguments)

    @classmethod
    def error(cls, status: int, error_type: str, message: str) -> Answer:
        """An Anthropic error of ``status``."""
        return cls(status=status, error_body={"type": "error", "error": {"type": error_type, "message": message}})


@dataclass(frozen=True)
class Received:
    """One request the server received."""

    method: str
    path: str
    body: Any
    headers: dict[str, str]


def _last_user_text(body: dict[str, Any]) -> str:
    content = body["messages"][-1]["content"]
    if isinstance(content, str):
        return f"You said: {content}"
    results = [b for b in content if b.get("type") == "tool_result"]
    if results:
        said = [r["content"] if isinstance(r["content"], str) else r["content"][0]["text"] for r in results]
        return f"The tool said: {' '.join(said)}"
    return "You said: " + [b["text"] for b in content if b.get("type") == "text"][-1]


class FakeAnthropicServer:
    """The Messages API on 127.0.0.1 with scripted replies (module docstring); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: deque[Answer] = deque()
        self.received: list[Received] = []
        self.streams_sent: list[bytes] = []
        # Added to every default answer (a benchmark tags its passes, so each stored turn is new).
        self.tag = ""
        self._ids = itertools.count(1)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                """Silent: tests read :attr:`FakeAnthropicServer.received`."""

            def do_GET(self) -> None:  # noqa: N802
                """``GET /v1/models``."""
                owner._handle(self, "GET")

            def do_POST(self) -> None:  # noqa: N802
                """``POST /v1/messages`` and ``/v1/messages/count_tokens``."""
                owner._handle(self, "POST")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                                        daemon=True)

    def __enter__(self) -> FakeAnthropicServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def base_url(self) -> str:
        """The base URL Anthropic clients take (they add ``/v1/…`` themselves)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def script(self, *answers: Answer) -> None:
        """Queue replies for ``/v1/messages``, used in order before the default one."""
        with self._lock:
            self._queue.extend(answers)

    @property
    def messages_received(self) -> list[Received]:
        """The ``POST /v1/messages`` requests, in order."""
        with self._lock:
            return [r for r in self.received if r.path.split("?")[0] == "/v1/messages"]

    # --- serving -------------------------------------------------------------------------------

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        path = handler.path
        with self._lock:
            self.received.append(Received(method, path, body, {k.lower(): v for k, v in handler.headers.items()}))
            route = path.split("?")[0]
            answer = self._queue.popleft() if self._queue and route == "/v1/messages" else None
        if method == "GET" and route == "/v1/models":
            self._send_json(handler, 200, {"data": [{"type": "model", "id": FAKE_MODEL, "display_name": "Fake",
                                                     "created_at": "2025-01-01T00:00:00Z"}],
                                           "has_more": False, "first_id": FAKE_MODEL, "last_id": FAKE_MODEL})
            return
        if route == "/v1/messages/count_tokens":
            self._send_json(handler, 200, {"input_tokens": len(raw) // 4})
            return
        if route != "/v1/messages":
            self._send_json(handler, 404, {"type": "error", "error": {"type": "not_found_error", "message": path}})
            return
        if not isinstance(body, dict):
            # As the real API answers a message request without a JSON object body.
            self._send_json(handler, 400, {"type": "error", "error": {
                "type": "invalid_request_error", "message": "the request body must be a JSON object"}})
            return
        answer = answer or Answer(text=_last_user_text(body) + self.tag)
        if answer.status is not None:
            self._send_json(handler, answer.status, answer.error_body)
            return
        message = self._message(body, answer)
        if body.get("stream"):
            self._stream(handler, message, answer)
        else:
            self._send_json(handler, 200, message, {"request-id": f"req_fake_{next(self._ids)}"})

    def _message(self, body: dict[str, Any], answer: Answer) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if answer.text:
            content.append({"type": "text", "text": answer.text})
        if answer.tool:
            content.append({"type": "tool_use", "id": f"toolu_fake_{next(self._ids)}", "name": answer.tool,
                            "input": answer.tool_input})
        return {"id": f"msg_fake_{next(self._ids)}", "type": "message", "role": "assistant",
                "model": body.get("model", FAKE_MODEL), "content": content,
                "stop_reason": "tool_use" if answer.tool else "end_turn", "stop_sequence": None,
                "usage": {"input_tokens": 12, "output_tokens": 7}}

    @staticmethod
    def events(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """The server-sent events of ``message``, as Anthropic streams it (a ping, text in two deltas,
        a tool call's input as JSON fragments)."""
        start = {**message, "content": [], "stop_reason": None, "usage": {"input_tokens": 12, "output_tokens": 1}}
        events: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": start}),
                                                     ("ping", {"type": "ping"})]
        for index, block in enumerate(message["content"]):
            if block["type"] == "text":
                events.append(("content_block_start", {"type": "content_block_start", "index": index,
                                                        "content_block": {"type": "text", "text": ""}}))
                half = len(block["text"]) // 2
                for piece in (block["text"][:half], block["text"][half:]):
                    events.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                            "delta": {"type": "text_delta", "text": piece}}))
            else:
                events.append(("content_block_start", {"type": "content_block_start", "index": index,
                                                        "content_block": {**block, "input": {}}}))
                arguments = json.dumps(block["input"])
                for piece in (arguments[:5], arguments[5:]):
                    events.append(("content_block_delta", {"type": "content_block_delta", "index": index,
                                                            "delta": {"type": "input_json_delta",
                                                                      "partial_json": piece}}))
            events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        events.append(("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                                         "usage": {"output_tokens": 7}}))
        events.append(("message_stop", {"type": "message_stop"}))
        return events

    def _stream(self, handler: BaseHTTPRequestHandler, message: dict[str, Any], answer: Answer) -> None:
        events = self.events(message)
        if answer.cut_after_events is not None:
            events = events[: answer.cut_after_events]
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream; charset=utf-8")
        handler.send_header("request-id", f"req_fake_{next(self._ids)}")
        handler.send_header("Connection", "close")
        handler.end_headers()
        sent = b""
        try:
            for name, data in events:
                chunk = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
                handler.wfile.write(chunk)
                handler.wfile.flush()
                sent += chunk
        except (BrokenPipeError, ConnectionResetError):
            pass
        handler.close_connection = True
        with self._lock:
            self.streams_sent.append(sent)

    @staticmethod
    def _send_json(handler: BaseHTTPRequestHandler, status: int, body: Any,
                   headers: dict[str, str] | None = None) -> None:
        payload = json.dumps(body).encode("utf-8")
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(payload)))
        for name, value in (headers or {}).items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(payload)
        handler.wfile.flush()
