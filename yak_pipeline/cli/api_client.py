"""The CLI's way to the API: a running server, or the app in this process.

Which server: ``--remote URL``; else ``YAK_API_URL``; else the one ``yak serve`` (and so
``yak up``) recorded in ``$YAK_HOME/server.json`` while it runs. A command against a running
server takes a fraction of a second; in-process it first loads the embedder and opens the
database, seconds. When the configured or recorded server does not answer (it was stopped, or
crashed), the command says so on stderr and runs in-process; an explicit ``--remote`` that does
not answer is an error.

Against a server, a request is one call of the standard library's ``http.client``: every command
pays for what it imports, and httpx's client (httpcore, the trio it probes for, the system's CA
certificates loaded even for plain http) cost about 0.3 s of CPU per command here, about a third
of a command's time with the server up (docs/BENCHMARKS.md). In-process, requests go through
``httpx.ASGITransport`` to ``create_app`` on the configured database, so the commands behave
exactly as against a server. Someone who can run Yak
in-process already holds the database credentials, so without ``--api-key`` the in-process
app accepts a random admin key that never leaves this process. Against a server the key is
``--api-key``, else ``YAK_API_KEY``, else ``YAK_ADMIN_API_KEY`` (set in the same shell as the
server, which then stores no key file), else the admin key ``yak serve`` stored on first start.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final
from urllib.parse import urlencode, urlsplit

import typer

from yak_pipeline.cli.config import ClientSettings
from yak_pipeline.cli.errors import FAILURE_EXIT, USAGE_EXIT, fail
from yak_pipeline.cli.parts import CliParts, cli_parts

if TYPE_CHECKING:
    import httpx
    from fastapi import FastAPI

    from yak_pipeline.settings import Settings
    from yak_pipeline.store.database import Database

REQUEST_TIMEOUT_SECONDS: Final = 120.0
ADMIN_KEY_FILE_NAME: Final = "admin-api-key"
SERVER_RECORD_FILE_NAME: Final = "server.json"

RemoteOption = Annotated[str | None, typer.Option(
    "--remote", metavar="URL",
    help="URL of a running `yak serve` (default: YAK_API_URL, else the server `yak serve` recorded, "
         "else the API in this process).")]
ApiKeyOption = Annotated[str | None, typer.Option(
    "--api-key", envvar="YAK_API_KEY", show_envvar=True, metavar="KEY",
    help="API key (default in-process: local admin; remote: the key file `yak serve` wrote).")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of a table.")]


class ApiError(Exception):
    """The server said no (``status`` ≥ 400) or could not be reached (``status`` 0)."""

    def __init__(self, status: int, detail: str, body: Any = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.body = body


def admin_key_file(settings: Settings | ClientSettings) -> Path:
    """Where ``yak serve`` stores the admin key it creates on first start."""
    return settings.home / ADMIN_KEY_FILE_NAME


def server_record_file(settings: Settings | ClientSettings) -> Path:
    """Where a running ``yak serve`` records the URL it answers on."""
    return settings.home / SERVER_RECORD_FILE_NAME


def record_server(settings: Settings, host: str, port: int) -> Callable[[], None]:
    """Record this process's server for the CLI; returns the function that removes the record.

    Written atomically (a reader never sees half a file); removed only if it is still this
    process's (another ``yak serve`` may have started since).
    """
    # A server listening on every interface answers on loopback too.
    reachable = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    url = f"http://[{reachable}]:{port}" if ":" in reachable else f"http://{reachable}:{port}"
    path = server_record_file(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps({"url": url, "pid": os.getpid()}))
    partial.replace(path)

    def forget() -> None:
        if _read_record(path).get("pid") == os.getpid():
            path.unlink(missing_ok=True)

    return forget


def _read_record(path: Path) -> dict:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def configured_server(settings: Settings | ClientSettings) -> str | None:
    """``YAK_API_URL``, else the server ``yak serve`` recorded if its process is alive; else None."""
    if settings.api_url:
        return settings.api_url
    record = _read_record(server_record_file(settings))
    url, pid = record.get("url"), record.get("pid")
    if not isinstance(url, str) or not isinstance(pid, int):
        return None
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # it exists, as another user
    return url


@dataclass(frozen=True)
class _Answer:
    """A response as the CLI reads it, from a server or from the in-process app."""

    status_code: int
    content_type: str
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.body)


def _detail(answer: _Answer) -> tuple[str, Any]:
    try:
        body = answer.json()
    except ValueError:
        return " ".join(answer.text.split())[:300] or f"HTTP {answer.status_code}", None
    detail = body.get("detail") if isinstance(body, dict) else None
    return (str(detail) if detail else f"HTTP {answer.status_code}"), body


def _result(answer: _Answer) -> Any:
    if answer.status_code >= 400:
        detail, body = _detail(answer)
        raise ApiError(answer.status_code, detail, body)
    if answer.content_type.startswith("application/json"):
        return answer.json()
    return answer.text


def _query_value(value: Any) -> str:
    # As httpx (and so the API's tests) spell them: booleans in lower case.
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


class _Server:
    """One running server: a request is a fresh ``http.client`` connection (one per command)."""

    def __init__(self, url: str, headers: Mapping[str, str]) -> None:
        parts = urlsplit(url)
        self.url = url
        self._valid = parts.scheme in ("http", "https") and bool(parts.hostname)
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname or "", parts.port
        self._prefix = parts.path.rstrip("/")
        self._headers = dict(headers)

    def request(self, method: str, path: str, *, params: Mapping[str, Any], json_body: Any) -> _Answer:
        """Send one request; raises ``ConnectionRefusedError`` when nothing listens, ``OSError`` or
        ``http.client.HTTPException`` for other failures."""
        if not self._valid:
            raise ApiError(0, f"{self.url!r} is not the http(s) URL of a Yak server")
        query = urlencode([(key, _query_value(v)) for key, value in params.items()
                           for v in (value if isinstance(value, list | tuple) else [value])])
        target = f"{self._prefix}{path}" + (f"?{query}" if query else "")
        headers = {**self._headers, "Accept": "application/json"}
        body = None
        if json_body is not None:
            body = json.dumps(json_body, ensure_ascii=False, allow_nan=False).encode("utf-8")
            headers["Content-Type"] = "application/json"
        import http.client  # imported by the commands that send a request, not by `yak --help`

        connection_type = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        connection = connection_type(self._host, self._port, timeout=REQUEST_TIMEOUT_SECONDS)
        try:
            connection.request(method, target, body=body, headers=headers)
            response = connection.getresponse()
            return _Answer(response.status, response.getheader("content-type", ""), response.read())
        finally:
            connection.close()


class ApiClient:
    """Sends requests to a remote server or to the in-process app (see the module docstring)."""

    def __init__(self, parts: CliParts, *, remote: str | None, api_key: str | None) -> None:
        # A server found on its own (not named by --remote) may have gone: then run in-process.
        self._parts = parts
        self._fallback = remote is None
        remote = remote or configured_server(parts.client)
        self._remote = remote.rstrip("/") if remote else None
        self._api_key = api_key
        self._server: _Server | None = None
        self._app: FastAPI | None = None
        self._database: Database | None = None
        if self._remote:
            key = api_key or self._stored_admin_key()
            self._server = _Server(self._remote, {"X-API-Key": key} if key else {})
        else:
            self._go_in_process()

    def _go_in_process(self) -> None:
        local_admin = self._open_in_process()
        self._key = self._api_key or local_admin

    def _stored_admin_key(self) -> str | None:
        """The admin key of this configuration: ``YAK_ADMIN_API_KEY`` when set (``yak serve`` then
        writes no key file), else the file ``yak serve`` wrote on first start."""
        settings = self._parts.client
        if settings.admin_api_key is not None:
            return settings.admin_api_key
        path = admin_key_file(settings)
        return path.read_text().strip() if path.is_file() else None

    def _open_in_process(self) -> str:
        import secrets  # here, not at the top: hashlib, hmac and random cost every command a few ms

        from yak_pipeline.api.app import create_app
        from yak_pipeline.wiring import build_parts, open_database

        settings = self._parts.settings
        local_admin = secrets.token_urlsafe(32)
        # Its own small pool, closed with the command (the process-wide one would outlive it).
        self._database = open_database(settings, max_size=4)
        self._app = create_app(build_parts(settings, database=self._database), extra_admin_keys=(local_admin,),
                               served=False)
        return local_admin

    async def _asgi_request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        import httpx

        assert self._app is not None  # the first request made it (_open_in_process)
        transport = httpx.ASGITransport(app=self._app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://yak.in-process",
                                     headers={"X-API-Key": self._key}, timeout=REQUEST_TIMEOUT_SECONDS) as client:
            return await client.request(method, path, **kwargs)

    def request(self, method: str, path: str, *, json_body: Any = None, params: dict | None = None) -> Any:
        """Send one request; the parsed JSON (or text) answer, or :class:`ApiError`."""
        params = {k: v for k, v in (params or {}).items() if v is not None}
        if self._server is not None:
            import http.client  # for its HTTPException below; _Server.request imports it anyway

            try:
                answer = self._server.request(method, path, params=params, json_body=json_body)
            except ConnectionRefusedError as exc:
                if not self._fallback:
                    raise ApiError(0, f"cannot reach {self._remote}: {type(exc).__name__}: {exc}") from None
                # Nothing reached the server, so nothing can have happened twice.
                print(f"note: no Yak server answers at {self._remote}; running this command in-process",
                      file=sys.stderr)
                self._server = None
                self._go_in_process()
                return self.request(method, path, json_body=json_body, params=params)
            except (OSError, http.client.HTTPException) as exc:
                raise ApiError(0, f"cannot reach {self._remote}: {type(exc).__name__}: {exc}") from None
        else:
            kwargs: dict[str, Any] = {"params": params}
            if json_body is not None:
                kwargs["json"] = json_body
            import asyncio  # in-process only: a request to a server needs no event loop

            response = asyncio.run(self._asgi_request(method, path, **kwargs))
            answer = _Answer(response.status_code, response.headers.get("content-type", ""), response.content)
        return _result(answer)

    def close(self) -> None:
        """Close connections; in-process, write this process's request metrics first."""
        if self._database is not None:
            try:
                if self._app is not None:
                    self._app.state.services.metrics.flush(self._database)
            except Exception:  # noqa: BLE001, S110 - counting this command's requests is best effort
                pass
            finally:
                self._database.close()


@contextmanager
def api_client(ctx: typer.Context, remote: str | None, api_key: str | None) -> Iterator[ApiClient]:
    """An :class:`ApiClient` for one command (its parts from ``ctx``); a refusal becomes ``error: …``
    and exit code 1."""
    client = ApiClient(cli_parts(ctx), remote=remote, api_key=api_key)
    try:
        yield client
    except ApiError as exc:
        raise fail(exc.detail, FAILURE_EXIT) from None
    finally:
        client.close()


def call_api(ctx: typer.Context, remote: str | None, api_key: str | None, method: str, path: str, *,
             json_body: Any = None, params: dict | None = None) -> Any:
    """One request in one call, for commands that make one."""
    with api_client(ctx, remote, api_key) as client:
        return client.request(method, path, json_body=json_body, params=params)


def parse_id(value: str, what: str = "id") -> str:
    """``value`` as a canonical UUID string, or a usage error (exit 2)."""
    try:
        return str(uuid.UUID(value.strip()))
    except ValueError:
        raise fail(f"{what} {value!r} is not a UUID", USAGE_EXIT) from None


def emit(data: Any, as_json: bool, render: Callable[[Any], None]) -> None:
    """JSON for scripts, or ``render`` for people."""
    if as_json:
        sys.stdout.write(json.dumps(data) + "\n")
    else:
        render(data)
