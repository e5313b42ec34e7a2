"""A real HTTP server on 127.0.0.1 that speaks the OpenAI protocol, with scripted answers.

Tests and benchmarks drive Yak's real ``openai`` client (and the memory proxy) against it: nothing
in the HTTP path is mocked. It serves

- ``POST /v1/chat/completions`` — scripted replies (:meth:`FakeOpenAIServer.script`) in order, then
  the default replier (:mod:`yak_loopback.openai_replies`: Yak's own prompts answered by the rules
  provider, or any chat with :func:`~yak_loopback.openai_replies.chat_replier`);
  with ``"stream": true`` the answer comes as server-sent events, word by word, with its finish
  reason, usage when ``stream_options.include_usage`` asks, and ``[DONE]``, in chunked encoding;
- ``POST /v1/embeddings`` — deterministic unit vectors seeded by a hash of each text (float or
  base64 encoding, as the client asks), or scripted replies (:meth:`FakeOpenAIServer.script_embeddings`);
- ``GET /v1/models`` — one model.

Every request is recorded (:attr:`FakeOpenAIServer.requests`), and every stream sent.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from yak_loopback.openai_replies import (
    DEFAULT_EMBEDDING_DIMENSIONS,
    RecordedRequest,
    Replier,
    Reply,
    fake_embedding,
    rules_replier,
)


class _Handler(BaseHTTPRequestHandler):
    """Routes one HTTP request to the owning :class:`FakeOpenAIServer`."""

    # HTTP/1.1 keep-alive, as real servers speak it and as the client's connection pool expects.
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as real model servers set it: without it a stream's small writes wait on the
    # client's delayed ACKs (up to 40 ms each), which is no answer "at once".
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        """Silence the per-request stderr log; tests read :attr:`FakeOpenAIServer.requests` instead."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        """Serve ``GET /v1/models``."""
        self.server.owner._handle(self, "GET")

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        """Serve the chat-completions and embeddings endpoints."""
        self.server.owner._handle(self, "POST")


class _Server(ThreadingHTTPServer):
    """A threading HTTP server that knows its :class:`FakeOpenAIServer`."""

    # Handler threads may be sleeping in a slow reply when a test ends; they must not block exit.
    daemon_threads = True
    owner: FakeOpenAIServer


class FakeOpenAIServer:
    """An OpenAI-compatible HTTP server on 127.0.0.1 with scripted replies (see the module docstring).

    Thread-safe: the handler threads and the test share the queues and the request log under a lock.
    """

    def __init__(
        self,
        replier: Replier | None = None,
        *,
        embedding_dimensions: int = DEFAULT_EMBEDDING_DIMENSIONS,
        model: str = "fake-model",
    ) -> None:
        self.replier: Replier = replier or rules_replier
        self.embedding_dimensions = embedding_dimensions
        self.model = model
        self._lock = threading.Lock()
        self._chat_queue: deque[Reply] = deque()
        self._embedding_queue: deque[Reply] = deque()
        self._requests: list[RecordedRequest] = []
        self._streams_sent: list[bytes] = []
        self._streams_dropped = 0
        self._ids = itertools.count(1)
        self._stopping = threading.Event()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> FakeOpenAIServer:
        """Bind a free port on 127.0.0.1 and serve in a daemon thread; returns ``self``."""
        if self._server is not None:
            return self
        self._stopping.clear()
        server = _Server(("127.0.0.1", 0), _Handler)
        server.owner = self
        self._server = server
        # A short poll interval: shutdown() waits up to one interval, and every test stops a server.
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-openai", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket; slow replies still sleeping are woken and dropped."""
        if self._server is None:
            return
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port (the server must be started)."""
        if self._server is None:
            raise RuntimeError("the fake OpenAI server is not started")
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        """The API base URL, e.g. ``http://127.0.0.1:PORT/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    # --- scripting and inspection ------------------------------------------------------------

    def script(self, *replies: Reply) -> FakeOpenAIServer:
        """Queue replies for chat completions, consumed in order before the default replier."""
        with self._lock:
            self._chat_queue.extend(replies)
        return self

    def script_embeddings(self, *replies: Reply) -> FakeOpenAIServer:
        """Queue replies for embeddings (``Reply.status``, ``Reply.delay``, ``Reply.close``, ``Reply.raw``)."""
        with self._lock:
            self._embedding_queue.extend(replies)
        return self

    @property
    def pending_replies(self) -> int:
        """Scripted chat replies not yet consumed."""
        with self._lock:
            return len(self._chat_queue)

    @property
    def requests(self) -> list[RecordedRequest]:
        """A copy of every request received so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        """The chat-completion requests received so far."""
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    @property
    def streams_sent(self) -> list[bytes]:
        """The event-stream bodies sent so far (as far as they got), in order."""
        with self._lock:
            return list(self._streams_sent)

    @property
    def streams_dropped_by_the_client(self) -> int:
        """How many streams the other side closed before their end (a write found the connection gone)."""
        with self._lock:
            return self._streams_dropped

    def clear(self) -> None:
        """Forget recorded requests and queued replies."""
        with self._lock:
            self._requests.clear()
            self._chat_queue.clear()
            self._embedding_queue.clear()

    # --- request handling --------------------------------------------------------------------

    def _handle(self, handler: _Handler, method: str) -> None:
        """Record the request, pick the reply, send it."""
        path = handler.path.split("?", 1)[0]
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except json.JSONDecodeError:
            body = None
        with self._lock:
            self._requests.append(RecordedRequest(method, path, body, {k.lower(): v for k, v in handler.headers.items()}))

        if method == "GET" and path == "/v1/models":
            listing = {"object": "list", "data": [{"id": self.model, "object": "model", "created": 0, "owned_by": "fake"}]}
            self._send_json(handler, 200, listing)
        elif method == "POST" and path == "/v1/chat/completions" and isinstance(body, dict):
            self._answer(handler, body, self._next(self._chat_queue), self._chat_body, stream=body.get("stream") is True)
        elif method == "POST" and path == "/v1/embeddings" and isinstance(body, dict):
            self._answer(handler, body, self._next(self._embedding_queue), self._embedding_body)
        elif path in ("/v1/chat/completions", "/v1/embeddings"):
            self._send_json(handler, 400, {"error": {"message": "body must be a JSON object", "type": "invalid_request_error"}})
        else:
            self._send_json(handler, 404, {"error": {"message": f"no route {method} {path}", "type": "not_found"}})

    def _next(self, queue: deque[Reply]) -> Reply | None:
        """The next scripted reply of ``queue``, or ``None`` when it is empty."""
        with self._lock:
            return queue.popleft() if queue else None

    def _answer(
        self,
        handler: _Handler,
        request: dict[str, Any],
        reply: Reply | None,
        success: Callable[[dict[str, Any], Reply | None], dict[str, Any]],
        *,
        stream: bool = False,
    ) -> None:
        """Send ``reply`` (``None``: the endpoint's normal answer), following delays."""
        while reply is not None and reply.kind == "delay":
            # An Event wait, not time.sleep: stop() wakes slow replies so shutdown is immediate.
            if self._stopping.wait(reply.seconds):
                handler.close_connection = True
                return
            reply = reply.then
        if reply is not None and reply.kind == "cut" and not stream:
            reply = Reply.close()
        if reply is not None and reply.kind == "close":
            handler.close_connection = True  # the handler returns without writing: the socket is closed
            return
        if reply is not None and reply.kind == "status":
            self._send_json(handler, reply.status_code, reply.body, dict(reply.headers))
            return
        if reply is not None and reply.kind == "raw":
            self._send_json(handler, reply.status_code, reply.body)
            return
        if stream:
            self._send_stream(handler, request, reply)
            return
        body = success(request, reply)
        status = int(body.pop("__status__", 200))
        self._send_json(handler, status, body)

    def _chat_body(self, request: dict[str, Any], reply: Reply | None) -> dict[str, Any]:
        """A chat.completion body for ``reply`` (``None``: ask the default replier)."""
        if reply is None or reply.kind == "delay":
            reply = self.replier(request)
            if reply.kind != "content":  # the replier may answer with an error too
                error = reply.body if isinstance(reply.body, dict) else {"error": {"message": "error"}}
                return {"__status__": reply.status_code, **error}
        body: dict[str, Any] = {
            "id": f"chatcmpl-fake-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.get("model", self.model),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply.content,
                                **({"tool_calls": list(reply.tool_calls)} if reply.tool_calls else {})},
                    "finish_reason": reply.finish_reason,
                }
            ],
        }
        if reply.prompt_tokens is not None or reply.completion_tokens is not None:
            prompt, completion = reply.prompt_tokens or 0, reply.completion_tokens or 0
            body["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
        return body

    def _send_stream(self, handler: _Handler, request: dict[str, Any], reply: Reply | None) -> None:
        """Stream a chat answer as server-sent events in chunked encoding; a ``cut`` reply stops mid-body."""
        if reply is None or reply.kind == "delay":
            reply = self.replier(request)
            if reply.kind == "status":
                self._send_json(handler, reply.status_code, reply.body, dict(reply.headers))
                return
        base = {"id": f"chatcmpl-fake-{next(self._ids)}", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": request.get("model", self.model)}
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        deltas += [{"content": piece} for piece in re.findall(r"\S+\s*|\s+", reply.content or "")]
        if reply.tool_calls:
            deltas.append({"tool_calls": [{"index": 0, **call} for call in reply.tool_calls]})
        events = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
        events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": reply.finish_reason}]})
        options = request.get("stream_options") or {}
        if options.get("include_usage"):
            prompt, completion = reply.prompt_tokens or 0, reply.completion_tokens or 0
            events.append({**base, "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                                          "total_tokens": prompt + completion}})
        lines = [f"data: {json.dumps(e)}\n\n".encode() for e in events] + [b"data: [DONE]\n\n"]
        sent = lines[: reply.cut_after] if reply.kind == "cut" else lines
        with self._lock:
            self._streams_sent.append(b"".join(sent))
        try:
            handler.send_response(200)
            handler.send_header("Content-Type", "text/event-stream")
            handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
            for index, line in enumerate(lines):
                if reply.kind == "cut" and index >= reply.cut_after:
                    handler.close_connection = True  # no terminating chunk: the body is visibly incomplete
                    return
                if reply.event_delay and self._stopping.wait(reply.event_delay):
                    return
                handler.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                handler.wfile.flush()
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            handler.close_connection = True
            with self._lock:
                self._streams_dropped += 1

    def _embedding_body(self, request: dict[str, Any], reply: Reply | None) -> dict[str, Any]:
        """An embeddings body: one deterministic vector per input, in the requested encoding."""
        raw_input = request.get("input")
        texts = [raw_input] if isinstance(raw_input, str) else list(raw_input or [])
        if not texts:
            return {"__status__": 400, "error": {"message": "input must not be empty", "type": "invalid_request_error"}}
        dimensions = request.get("dimensions") or self.embedding_dimensions
        data = []
        for index, text in enumerate(texts):
            vector = fake_embedding(text if isinstance(text, str) else json.dumps(text), int(dimensions))
            if request.get("encoding_format") == "base64":
                encoded: Any = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
            else:
                encoded = vector
            data.append({"object": "embedding", "embedding": encoded, "index": index})
        tokens = sum(len(str(t).split()) for t in texts)
        return {
            "object": "list",
            "data": data,
            "model": request.get("model", self.model),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    @staticmethod
    def _send_json(handler: _Handler, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        """Write one JSON response; a client that already hung up (timeout) is not an error."""
        payload = json.dumps(body).encode("utf-8")
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(payload)))
            for name, value in (headers or {}).items():
                handler.send_header(name, value)
            handler.end_headers()
            handler.wfile.write(payload)
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            handler.close_connection = True
