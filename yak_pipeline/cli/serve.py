"""``yak serve``: the HTTP API (memory proxy included) under uvicorn, with an admin key created on first
start; ``yak proxy``: the memory proxy alone; ``yak mcp``: the MCP server (stdio or streamable HTTP)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from yak_pipeline.cli.api_client import JsonOption, admin_key_file, record_server
from yak_pipeline.cli.errors import friendly_errors
from yak_pipeline.cli.parts import cli_parts
from yak_pipeline.store.errors import StoreError

if TYPE_CHECKING:  # every `yak` command imports this module; the store is imported when it serves
    from yak_pipeline.settings import Settings
    from yak_pipeline.store.database import Database


HostOption = Annotated[str, typer.Option("--host", help="Interface to listen on.")]
PortOption = Annotated[int, typer.Option("--port", min=1, max=65535, help="Port to listen on.")]


# How long an idle keep-alive connection stays open: longer than clients keep theirs (httpx and
# requests pools: 5 s), so a client never sends a request on a connection the server is closing at
# that moment (uvicorn's own default is also 5 s: the race showed as "connection reset by peer"
# under test_multi_process's load).
KEEP_ALIVE_SECONDS = 30

def ensure_admin_key(settings: Settings, database: Database) -> Path | None:
    """On first start, create an admin key and store it (mode 0600) in ``$YAK_HOME/admin-api-key``.

    Nothing is created when ``YAK_ADMIN_API_KEY`` is set or admin keys exist already (someone
    set keys up); the file is replaced when its key no longer works (a new database).
    Returns the file holding a working admin key, if there is one.
    """
    from yak_pipeline.services.api_keys import first_admin_key

    if settings.admin_api_key is not None:
        return None
    path = admin_key_file(settings)
    outcome, key = first_admin_key(database, path.read_text().strip() if path.is_file() else None,
                                   label="created by yak serve on first start", actor="yak serve")
    if outcome != "created" or key is None:
        return path if outcome == "file_works" else None
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(key + "\n")
    return path


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def serve_command(ctx: typer.Context, host: HostOption = "127.0.0.1", port: PortOption = 8000, as_json: JsonOption = False) -> None:
    """Run the HTTP API (OpenAPI at /openapi.json, /docs) and the web page (/ui) until Ctrl-C; on
    first start, create an admin key and say where it is stored."""
    import uvicorn

    from yak_pipeline.api.access_log import uvicorn_log_options
    from yak_pipeline.api.app import create_app

    parts = cli_parts(ctx).parts
    settings = parts.settings
    key_file, warning = None, None
    try:
        key_file = ensure_admin_key(settings, parts.database)
    except StoreError as exc:
        # The API still starts: /health reports the database, other routes answer 503.
        warning = f"database not ready: {exc}"
    info = {"url": f"http://{host}:{port}", "openapi": f"http://{host}:{port}/openapi.json",
            "web_page": f"http://{host}:{port}/ui",
            "admin_key_file": str(key_file) if key_file else None, "warning": warning}
    if as_json:
        print(json.dumps(info), flush=True)
    else:
        print(f"Yak API on {info['url']} (OpenAPI at {info['openapi']}; memory proxy at {info['url']}/v1)",
              flush=True)
        print(f"web page at {info['web_page']} (sign in with an API key)", flush=True)
        if key_file:
            print(f"admin API key stored in {key_file} (`yak keys show-admin` prints it)", flush=True)
        if warning:
            print(f"warning: {warning}", file=sys.stderr, flush=True)
    # The CLI finds this server through the record and sends its commands here (api_client).
    forget = record_server(settings, host, port)
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again under the handler
    # it found: the default one would end the process before the record is removed.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        uvicorn.run(create_app(parts), host=host, port=port, timeout_keep_alive=KEEP_ALIVE_SECONDS,
                    **uvicorn_log_options(settings.access_log))
    finally:
        forget()


def proxy_command(ctx: typer.Context, host: HostOption = "127.0.0.1", port: PortOption = 8001, as_json: JsonOption = False,
                  show_block: bool = typer.Option(
                      False, "--show-block",
                      help="Log the memory block injected into each chat (private text: for debugging).")) -> None:
    """Run the memory proxy alone until Ctrl-C: /v1 that recalls before and remembers after every chat,
    in OpenAI's protocol (/v1/chat/completions, forwarded to YAK_UPSTREAM_BASE_URL) and Anthropic's
    (/v1/messages for Claude Code, forwarded to YAK_UPSTREAM_ANTHROPIC_BASE_URL) on one port (`yak serve`
    and `yak up` serve it too, under /v1 of the API). OpenAI clients use a Yak API key as their key;
    Anthropic clients send it in X-Yak-Key beside their own Anthropic key. Each answer's
    X-Yak-Recalled-Ids header names the memories put into its prompt."""
    import uvicorn

    from yak_pipeline.api.access_log import uvicorn_log_options
    from yak_pipeline.api.app import create_proxy_app
    from yak_pipeline.wiring import build_parts

    parts = cli_parts(ctx).parts
    if show_block:
        parts = build_parts(parts.settings.model_copy(update={"proxy_show_block": True}))
    settings = parts.settings
    upstream, _ = settings.resolved_upstream
    warnings = []
    if upstream is None:
        warnings.append("no upstream model server: set YAK_UPSTREAM_BASE_URL (OpenAI chats answer 503 until then)")
    try:
        _ = parts.database  # opened now, so a database that is not ready is said before the first chat
    except StoreError as exc:
        warnings.append(f"database not ready: {exc}")
    info = {"url": f"http://{host}:{port}/v1", "upstream": _without_credentials(upstream), "warnings": warnings}
    if as_json:
        print(json.dumps(info), flush=True)
    else:
        print(f"Yak memory proxy on {info['url']} (upstream: {info['upstream'] or 'none'}; Anthropic /v1/messages: "
              f"{_without_credentials(settings.upstream_anthropic_base_url)})", flush=True)
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr, flush=True)
    uvicorn.run(create_proxy_app(parts), host=host, port=port, timeout_keep_alive=KEEP_ALIVE_SECONDS,
                **uvicorn_log_options(settings.access_log))


def mcp_command(
    ctx: typer.Context,
    user: str | None = typer.Option(None, "--user", help="The user whose memories the tools use (stdio: "
                                    "required; HTTP: for admin keys only)."),
    http: bool = typer.Option(False, "--http", help="Serve streamable HTTP at /mcp instead of stdio."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to listen on (with --http)."),
    port: int = typer.Option(8002, "--port", min=1, max=65535, help="Port to listen on (with --http)."),
) -> None:
    """Serve Yak's memory to MCP clients (tools memory_search, memory_save, memory_forget,
    memory_recent): over stdio for --user, or over streamable HTTP (--http) where each request's
    user-scoped API key (X-API-Key or Authorization: Bearer) decides whose memories it reaches."""
    from yak_pipeline.api.dependencies import ApiServices
    from yak_pipeline.api.mcp_server import MCP_PATH, build_mcp_server, mcp_http_app
    from yak_pipeline.cli.errors import USAGE_EXIT, fail
    from yak_pipeline.core.types import InvalidUserId, validate_user_id

    if user is not None:
        try:
            validate_user_id(user)
        except InvalidUserId as exc:
            raise fail(f"--user: {exc}", USAGE_EXIT) from None
    elif not http:
        raise fail("yak mcp over stdio needs --user U (whose memories the tools use)", USAGE_EXIT)
    parts = cli_parts(ctx).parts
    settings = parts.settings
    _ = parts.database  # opened now: the tools need it, and a database that is not ready fails the command
    services = ApiServices.of(parts)
    if not http:
        # stdout is the protocol's channel: nothing else may be printed there.
        build_mcp_server(services, user=user).run("stdio")
        return
    import uvicorn

    from yak_pipeline.api.access_log import uvicorn_log_options

    print(f"Yak MCP server on http://{host}:{port}{MCP_PATH} (streamable HTTP; send a user-scoped API key)",
          file=sys.stderr, flush=True)
    uvicorn.run(mcp_http_app(services, user=user, host=host), host=host, port=port,
                **uvicorn_log_options(settings.access_log))


def register(app: typer.Typer) -> None:
    """Add ``serve``, ``proxy`` and ``mcp`` to the ``yak`` app."""
    app.command("serve")(friendly_errors(serve_command))
    app.command("proxy")(friendly_errors(proxy_command))
    app.command("mcp")(friendly_errors(mcp_command))


def _without_credentials(url: str | None) -> str | None:
    """``url`` without a user name or password, fit to print."""
    if url is None:
        return None
    import httpx

    return str(httpx.URL(url).copy_with(username=None, password=None))
