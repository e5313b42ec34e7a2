"""MCP auth clients can read (issue 34): the ``mcp`` SDK's own client over streamable HTTP against the real
``yak mcp --http`` app under uvicorn, with a missing or wrong key, OAuth discovery probes, and typed
arguments of the wrong type.
"""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from yak_pipeline.api.dependencies import ApiServices
from yak_pipeline.api.mcp_server import MCP_PATH, mcp_http_app
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline_tests.api_fixtures import Seeded, api_settings, seeded, serve_in_thread  # noqa: F401


@pytest.fixture
def mcp_base(api_settings: Settings, database: Database) -> Any:  # noqa: F811
    """``yak mcp --http`` as an app under uvicorn; yields its base URL."""
    with serve_in_thread(mcp_http_app(ApiServices.of(api_settings, database=database))) as url:
        yield url


def http_client(url: str, key: str | None) -> Client:
    """The SDK's client over streamable HTTP, sending ``key`` as a bearer token."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return Client(streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers, timeout=30)))


def mcp_error(exc: BaseException) -> MCPError:
    """The SDK's error inside the exception (groups) its client raised."""
    if isinstance(exc, MCPError):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        try:
            return mcp_error(inner)
        except AssertionError:
            continue
    raise AssertionError(f"no MCPError in {exc!r}")


def test_a_missing_or_wrong_key_is_shown_by_the_sdk_as_an_invalid_yak_api_key(mcp_base: str) -> None:
    async def main() -> list[str]:
        said = []
        for key in (None, "not-a-yak-key"):
            with pytest.raises(BaseException) as refused:  # noqa: PT011 - the SDK wraps it in an exception group
                async with http_client(f"{mcp_base}{MCP_PATH}", key):
                    pass
            said.append(str(mcp_error(refused.value)))
        return said

    missing, wrong = anyio.run(main)
    assert missing.startswith("invalid Yak API key: missing X-API-Key header") and "\n" not in missing
    assert wrong.startswith("invalid Yak API key: invalid or revoked API key")
    assert "Authorization: Bearer" in wrong


@pytest.mark.parametrize("path", ["/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp",
                                  "/.well-known/oauth-authorization-server", "/.well-known/openid-configuration"])
def test_oauth_discovery_gets_a_clear_404(mcp_base: str, path: str) -> None:
    response = httpx.get(f"{mcp_base}{path}")
    assert response.status_code == 404 and response.headers["content-type"] == "application/json"
    assert response.json()["detail"].startswith("Yak's MCP server does not use OAuth: send a Yak API key")


def test_a_typed_argument_of_the_wrong_type_is_one_line(mcp_base: str, seeded: Seeded) -> None:  # noqa: F811
    async def main() -> str:
        async with http_client(f"{mcp_base}{MCP_PATH}", seeded.alice_key) as client:
            result = await client.call_tool("memory_search", {"query": "bike", "limit": "many"})
            assert result.is_error
            return result.content[0].text

    text = anyio.run(main)
    assert text == ("memory_search: invalid arguments: limit: Input should be a valid integer, unable to parse "
                    "string as an integer (got 'many')")
