"""``yak mcp``: Yak's memory as MCP tools, on the official ``mcp`` SDK, over stdio or streamable HTTP.

Four tools, each a thin shell over what the HTTP API calls: ``memory_search`` (the one recall
engine, ``services.recall.search_memories``), ``memory_save`` (a fact or an exchange, stored like
``POST /api/memories``), ``memory_forget`` (``services.forget``: an id at once, a phrase lists
candidates and a confirmation token) and ``memory_recent``; and the resource ``yak://memory.md``,
the user's MEMORY.md (``services.memory_export``, as ``GET /api/export/memory.md``). Over HTTP the
resource is a template (``yak://memory.md{?user_id}``: reading ``yak://memory.md`` matches it), as
only a template's reader learns whose key asks; over stdio it is also listed as a plain resource.

Every call acts for one user. Over stdio that is ``--user`` (whoever can start the process can
read its database anyway). Over HTTP it is the user the request's API key (``X-API-Key`` or
``Authorization: Bearer``) is scoped to: every HTTP request without a valid key is answered 401
before it reaches the SDK, and each tool call resolves its key again, so a session can never
act for another user than its key's. An admin key acts for ``--user`` when given, else it is
refused (an MCP client should hold a key that can reach one person's memories, not everyone's).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from datetime import date, datetime
from typing import Any, TypeVar
from uuid import UUID

import anyio.to_thread
from fastapi import HTTPException
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from yak_pipeline.api.auth import READ_ONLY_DETAIL, Principal, authenticate, key_from_headers
from yak_pipeline.api.dependencies import ApiServices
from yak_pipeline.core.exchanges import MAX_RECALL_QUERY_CHARS, MAX_TURN_MESSAGE_CHARS, format_exchange, turn_refusal
from yak_pipeline.core.forget import ForgetCommandError
from yak_pipeline.core.secrets import SecretRefused
from yak_pipeline.llm.errors import one_line
from yak_pipeline.services.forget import ForgetOutcome, confirm_forget, run_forget_command
from yak_pipeline.services.memories import ExchangeForgotten, list_memories, store_memory
from yak_pipeline.services.memory_export import memory_markdown
from yak_pipeline.services.recall import search_memories
from yak_pipeline.store.errors import DatabaseUnavailable

logger = logging.getLogger("yak.mcp")

MCP_PATH = "/mcp"
# The tools a read-only key may not call (it searches and lists, issue 35).
WRITING_TOOLS = frozenset({"memory_save", "memory_forget"})
# Where OAuth clients look for an authorization server after a 401 (RFC 9728, RFC 8414, OpenID).
OAUTH_METADATA_PREFIX = "/.well-known/"
HOW_TO_AUTHENTICATE = "send a Yak API key as X-API-Key or Authorization: Bearer (yak keys create --user U)"
NO_OAUTH = f"Yak's MCP server does not use OAuth: {HOW_TO_AUTHENTICATE}"
# A JSON-RPC server-defined error code (-32000…-32099) for a refused key.
AUTH_ERROR_CODE = -32001
_MAX_ARGUMENT_ERROR_CHARS = 300
# How much of a refused request's body is read for its JSON-RPC id.
_MAX_REFUSED_BODY_BYTES = 64 * 1024
MEMORY_RESOURCE_URI = "yak://memory.md"
MEMORY_RESOURCE_TEMPLATE = MEMORY_RESOURCE_URI + "{?user_id}"
INSTRUCTIONS = """Yak is the user's long-term memory. Search it (memory_search) before answering anything
that may depend on what the user said before; save durable facts and finished exchanges
(memory_save); list what was stored lately (memory_recent). Forget only when the user asks
explicitly (memory_forget): a phrase returns candidates and a token; confirm with the token only
after the user agreed."""

T = TypeVar("T")


def _plain(value: Any) -> Any:
    """``value`` with datetimes, dates and UUIDs as strings, fit for a tool's JSON result."""
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _forget_result(outcome: ForgetOutcome) -> dict[str, Any]:
    return _plain({"action": outcome.action, "deleted_memory_ids": outcome.deleted_memory_ids,
                   "not_found": outcome.not_found, "candidates": outcome.candidates,
                   "confirmation_token": outcome.token, "expires_at": outcome.expires_at})


class YakMemoryTools:
    """The tools' work, synchronous (run in worker threads), for a resolved user."""

    def __init__(self, services: ApiServices) -> None:
        self.services = services

    def search(self, user_id: str, query: str, limit: int, threshold: float, explain: bool) -> dict[str, Any]:
        """The user's best memories for ``query`` (the recall engine of ``/api/distillations/search``)."""
        services = self.services
        hits = search_memories(services.database, services.embedder, user_id=user_id, query=query,
                               params=services.recall_params(threshold=threshold, limit=limit),
                               model=services.relevance_model, judge=services.judge)
        return _plain({"memories": [{
            "id": h.id, "kind": h.kind, "memory_id": h.memory_id, "content": h.content, "tier": h.tier,
            # A distilled memory's type (and an event's day); a raw one (the user's words) has none.
            "type": h.memory_type, **({"event_on": h.event_on} if h.event_on else {}),
            "said_at": h.occurred_at, **({"reply": h.reply} if h.reply else {}),
            "relevance": round(h.relevance, 2), "score": round(h.score, 2), "superseded": h.superseded_by is not None,
            "in_conflict": h.in_conflict, **({"explain": h.explain()} if explain else {})} for h in hits]})

    def save(self, user_id: str, content: str, actor: str) -> dict[str, Any]:
        """Store ``content`` as a pending memory, like ``POST /api/memories`` (the same text once)."""
        created, row = store_memory(self.services.database, user_id=user_id, content=content, source="api",
                                    occurred_at=None, actor=actor, embedder=self.services.embedder)
        return {"memory_id": str(row["id"]), "stored": created,
                "note": "stored and recallable now (as your own words); the pipeline distils it when it runs"
                if created else "already stored"}

    def forget(self, user_id: str, target: str | None, token: str | None, actor: str) -> dict[str, Any]:
        """Forget by id at once, list a phrase's candidates with a token, or confirm a token."""
        if token:
            return _forget_result(confirm_forget(self.services.database, user_id=user_id, token=token, actor=actor))
        return _forget_result(run_forget_command(self.services.database, user_id=user_id, command=f"/forget {target}",
                                                 actor=actor))

    def memory_file(self, user_id: str) -> str:
        """The user's MEMORY.md (a user with no memories yet gets one that says so)."""
        text, _ = memory_markdown(self.services.database, user_id, known_only=False)
        return text

    def recent(self, user_id: str, limit: int) -> dict[str, Any]:
        """The user's latest memories, newest exchange first."""
        rows = list_memories(self.services.database, user_id=user_id, limit=limit)
        return _plain({"memories": [{"memory_id": r["id"], "content": r["content"], "said_at": r["occurred_at"],
                                     "status": r["status"]} for r in rows]})


class YakMCPServer(MCPServer):
    """The SDK's server, with arguments of the wrong type refused in one line the model can act on
    (the SDK's own message is pydantic's multi-line dump, with a link to its docs)."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Context | None = None) -> Any:
        """The SDK's call, its argument validation errors said in one line."""
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            if isinstance(exc.__cause__, ValidationError):
                raise ToolError(f"{name}: {invalid_arguments(exc.__cause__)}") from None
            raise


def invalid_arguments(error: ValidationError) -> str:
    """``limit: must be an integer (got 'many')``-style: each wrong argument and why, on one line."""
    parts = []
    for problem in error.errors(include_url=False):
        where = ".".join(str(p) for p in problem.get("loc", ())) or "arguments"
        given = f" (got {problem['input']!r})" if problem.get("type") != "missing" and "input" in problem else ""
        parts.append(f"{where}: {problem.get('msg', 'invalid')}{given}")
    return one_line("invalid arguments: " + "; ".join(parts), _MAX_ARGUMENT_ERROR_CHARS)


def build_mcp_server(services: ApiServices, *, user: str | None, stdio: bool = True) -> MCPServer:
    """The MCP server acting for ``user`` (stdio), or for each HTTP request's key's user (``user`` then
    only serves admin keys; ``stdio=False``)."""
    server = YakMCPServer("yak", instructions=INSTRUCTIONS, description="Yak, a personal memory for LLMs")
    tools = YakMemoryTools(services)
    run = _tool_runner(services, user)
    _add_memory_tools(server, tools, run)
    _add_memory_resources(server, tools, run, stdio_user=user if stdio else None)
    return server


# ``run(tool, ctx, work)``: ``work(user_id, actor)`` for the caller's user (see :func:`_tool_runner`).
ToolRunner = Callable[[str, Context, Callable[[str, str], T]], Awaitable[T]]


def _tool_runner(services: ApiServices, user: str | None) -> ToolRunner:
    """How every tool and resource call runs: as the user its key (or ``--user``) names, counted."""

    def principal_of(ctx: Context) -> Principal | None:
        headers = ctx.headers
        if headers is None:
            return None  # stdio: the process was started for --user
        try:
            return authenticate(services, key_from_headers(headers.get("x-api-key"), headers.get("authorization")))
        except HTTPException as exc:
            raise ToolError(str(exc.detail)) from None

    async def run(tool: str, ctx: Context, work: Callable[[str, str], T]) -> T:
        """``work(user_id, actor)`` in a worker thread for the caller's user; counted; errors in one line."""
        outcome = "error"
        try:
            principal = await anyio.to_thread.run_sync(principal_of, ctx)
            if principal is not None and principal.user_id is not None:
                user_id, actor = principal.user_id, "mcp:" + principal.actor.removeprefix("api:")
            elif user is not None:
                user_id, actor = user, "mcp:" + ("admin" if principal is not None else "stdio")
            else:
                raise ToolError("an admin key cannot say whose memories to use: use a key scoped to one user "
                                "(yak keys create --user U)")
            if principal is not None and principal.read_only and tool in WRITING_TOOLS:
                raise ToolError(READ_ONLY_DETAIL)
            result = await anyio.to_thread.run_sync(lambda: work(user_id, actor))
            outcome = "ok"
            return result
        except ToolError:
            outcome = "refused"
            raise
        except (ForgetCommandError, SecretRefused, ExchangeForgotten) as exc:
            outcome = "refused"
            raise ToolError(str(exc)) from None
        except DatabaseUnavailable:
            raise ToolError("the database is unavailable; try again shortly") from None
        finally:
            services.metrics.count_mcp_tool_call(tool, outcome)
            await _flush_metrics_if_due(services)

    return run


async def _flush_metrics_if_due(services: ApiServices) -> None:
    """Write the buffered metrics when their flush is due (a failed write stays buffered)."""
    database = services.database_if_open
    if database is not None and services.metrics.flush_due():
        try:
            await anyio.to_thread.run_sync(services.metrics.flush, database)
        except Exception as exc:  # noqa: BLE001 - kept buffered; the next flush retries
            logger.warning("could not write metrics yet: %s", type(exc).__name__)


def _content_to_save(fact: str | None, user_message: str | None, assistant_message: str | None) -> str:
    """What ``memory_save`` stores: the fact, or the exchange in ``User: …\\nAssistant: …`` form;
    a refusal (both or neither given, too long, NUL) as a :class:`ToolError`."""
    if fact is not None and (user_message is not None or assistant_message is not None):
        raise ToolError("give either a fact or an exchange (user_message and assistant_message), not both")
    if fact is not None:
        refusal = turn_refusal(fact, "-")
        content = fact
    elif user_message is not None and assistant_message is not None:
        refusal = turn_refusal(user_message, assistant_message)
        content = format_exchange(user_message, assistant_message)
    else:
        raise ToolError("give a fact, or both user_message and assistant_message")
    if refusal is not None:
        raise ToolError(refusal.replace("the user message", "the fact" if fact is not None else "the user message")
                        + f" (limit {MAX_TURN_MESSAGE_CHARS:,} characters, no NUL)")
    return content


def _add_memory_tools(server: MCPServer, tools: YakMemoryTools, run: ToolRunner) -> None:
    """The four tools, in the order clients list them: search, save, forget, recent."""

    @server.tool()
    async def memory_search(query: str, ctx: Context, limit: int = 5, explain: bool = False,
                            threshold: float = 0.7) -> dict[str, Any]:
        """Search the user's memories for what is relevant to `query` (a question or topic), best first.
        `limit` 1-50; `explain` adds each memory's score breakdown; `threshold` 0-1 (lower finds more)."""
        if not query.strip() or len(query) > MAX_RECALL_QUERY_CHARS:
            raise ToolError(f"query: give 1 to {MAX_RECALL_QUERY_CHARS:,} characters")
        if not 1 <= limit <= 50 or not 0.0 <= threshold <= 1.0:
            raise ToolError("limit must be 1-50 and threshold 0-1")
        return await run("memory_search", ctx, lambda u, _: tools.search(u, query, limit, threshold, explain))

    @server.tool()
    async def memory_save(ctx: Context, fact: str | None = None, user_message: str | None = None,
                          assistant_message: str | None = None) -> dict[str, Any]:
        """Remember something: either a `fact` (a sentence about the user), or an exchange
        (`user_message` and `assistant_message`). The pipeline distils it into memories."""
        content = _content_to_save(fact, user_message, assistant_message)
        return await run("memory_save", ctx, lambda u, actor: tools.save(u, content, actor))

    @server.tool()
    async def memory_forget(ctx: Context, target: str | None = None,
                            confirmation_token: str | None = None) -> dict[str, Any]:
        """Forget memories the user explicitly asked to forget. `target` a memory id (deleted at once)
        or an exact phrase (nothing deleted: returns the matching memories and a `confirmation_token`);
        call again with only `confirmation_token` once the user confirmed, to delete those."""
        if bool(target and target.strip()) == bool(confirmation_token):
            raise ToolError("give either a target (memory id or phrase) or a confirmation_token")
        return await run("memory_forget", ctx, lambda u, actor: tools.forget(u, target, confirmation_token, actor))

    @server.tool()
    async def memory_recent(ctx: Context, limit: int = 10) -> dict[str, Any]:
        """The user's most recently said memories (raw exchanges and facts), newest first; `limit` 1-100."""
        if not 1 <= limit <= 100:
            raise ToolError("limit must be 1-100")
        return await run("memory_recent", ctx, lambda u, _: tools.recent(u, limit))


def _add_memory_resources(server: MCPServer, tools: YakMemoryTools, run: ToolRunner, *,
                          stdio_user: str | None) -> None:
    """The user's MEMORY.md: a template every caller reads, and, over stdio for ``stdio_user``,
    also a listed resource."""
    memory_description = "What Yak knows about the user now: current memories by tier, each dated."

    @server.resource(MEMORY_RESOURCE_TEMPLATE, name="MEMORY.md", mime_type="text/markdown",
                     description=memory_description)
    async def memory_md(ctx: Context, user_id: str | None = None) -> str:
        """The user's MEMORY.md: current knowledge grouped by tier, each memory with its date; superseded
        memories and those held for review left out; rebuilt from the database on every read.
        ``user_id``, when given, must be the caller's own."""
        def work(resolved: str, _: str) -> str:
            if user_id is not None and user_id != resolved:
                raise ToolError(f"this key reads only the MEMORY.md of {resolved}")
            return tools.memory_file(resolved)

        try:
            return await run("memory.md", ctx, work)
        except ToolError as exc:  # the same refusals, as a resource reports them
            raise ResourceError(str(exc)) from None

    if stdio_user is not None:
        # Listed, so clients that show resources offer it; a static resource's reader gets no
        # request (and no key), which over stdio is fine: the process acts for --user alone.
        @server.resource(MEMORY_RESOURCE_URI, name="MEMORY.md", mime_type="text/markdown",
                         description=memory_description)
        async def listed_memory_md() -> str:
            """The MEMORY.md of the user this stdio server was started for."""
            return await anyio.to_thread.run_sync(tools.memory_file, stdio_user)


class ApiKeyGate:
    """ASGI middleware: HTTP requests without a valid Yak API key get 401 before they reach the MCP SDK.

    The 401's body is a JSON-RPC error naming the problem ("invalid Yak API key: …"), which the MCP
    SDK shows as the request's error instead of "Server returned an error response". Yak's MCP
    server does not use OAuth: the well-known OAuth metadata paths, which clients probe after a
    401, get a 404 saying how to authenticate, so no client starts an OAuth flow.
    """

    def __init__(self, app: ASGIApp, services: ApiServices) -> None:
        self.app = app
        self.services = services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if scope.get("path", "").startswith(OAUTH_METADATA_PREFIX):
                await JSONResponse({"detail": NO_OAUTH, "error": "not_found", "error_description": NO_OAUTH},
                                   status_code=404)(scope, receive, send)
                return
            headers = Headers(scope=scope)
            try:
                await run_in_threadpool(authenticate, self.services,
                                        key_from_headers(headers.get("x-api-key"), headers.get("authorization")))
            except HTTPException as exc:
                message = f"invalid Yak API key: {exc.detail}; {HOW_TO_AUTHENTICATE}"
                request_id = await _request_id(receive) if scope.get("method") == "POST" else None
                body = {"jsonrpc": "2.0", "id": request_id, "error": {"code": AUTH_ERROR_CODE, "message": message}}
                await JSONResponse(body, status_code=exc.status_code, headers=exc.headers)(scope, receive, send)
                return
            except DatabaseUnavailable:
                await JSONResponse({"detail": "the database is unavailable; try again shortly"}, status_code=503,
                                   headers={"Retry-After": "5"})(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _request_id(receive: Receive) -> str | int | None:
    """The JSON-RPC id of a refused request's body (None when it has none or is no JSON-RPC request)."""
    chunks: list[bytes] = []
    more = True
    while more and sum(map(len, chunks)) < _MAX_REFUSED_BODY_BYTES:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    try:
        request_id = json.loads(b"".join(chunks)).get("id")
    except (ValueError, AttributeError):
        return None
    return request_id if isinstance(request_id, (str, int)) and not isinstance(request_id, bool) else None


def mcp_http_app(services: ApiServices, *, user: str | None = None, host: str = "127.0.0.1") -> ASGIApp:
    """The streamable-HTTP MCP app at ``/mcp``, behind the API-key gate."""
    server = build_mcp_server(services, user=user, stdio=False)
    return ApiKeyGate(server.streamable_http_app(streamable_http_path=MCP_PATH, host=host), services)
