"""``yak mcp`` (issue 13, part 2) driven by the ``mcp`` SDK's own client, over stdio and streamable HTTP.

Stdio runs the real ``yak mcp --user`` subprocess; HTTP runs the real app under uvicorn on
127.0.0.1. Both on the test's database with the seeded users alice and bob.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from yak_pipeline.api.dependencies import ApiServices
from yak_pipeline.api.mcp_server import MCP_PATH, mcp_http_app
from yak_pipeline.services.memories import forget_memory
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline.store.metrics import read_metrics
from yak_pipeline_tests.api_fixtures import ADMIN_KEY, Seeded, api_settings, seeded, serve_in_thread  # noqa: F401
from yak_pipeline_tests.pipeline_helpers import fetch_all, fetch_one

ROOT = Path(__file__).resolve().parents[1]
TOOLS = {"memory_search", "memory_save", "memory_forget", "memory_recent"}


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structured result; fails the test on a tool error."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    return result.structured_content


async def refused(client: Client, tool: str, **arguments: Any) -> str:
    """The text of a tool call that must fail."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    return result.content[0].text


async def exercise_alice(client: Client, seeded: Seeded) -> dict[str, Any]:  # noqa: F811
    """Every tool as alice, checking that nothing of bob's is reachable; returns what was saved."""
    assert {t.name for t in (await client.list_tools()).tools} == TOOLS
    found = await call(client, "memory_search", query="What is my locker code?", threshold=0.1, explain=True)
    texts = " ".join(m["content"] for m in found["memories"])
    assert seeded.alice.secret in texts and seeded.bob.secret not in texts
    assert "explain" in found["memories"][0]
    # Each memory carries its type (the seeded distillations are facts; a raw hit, the user's words, has none).
    assert {m["type"] for m in found["memories"] if m["kind"] == "distilled"} == {"fact"}
    assert all(m["type"] is None for m in found["memories"] if m["kind"] == "raw")
    saved = await call(client, "memory_save", fact="The user's bike is a green Gazelle.")
    assert saved["stored"] is True
    again = await call(client, "memory_save", fact="The user's bike is a green Gazelle.")
    assert again == {**saved, "stored": False, "note": "already stored"}
    exchange = await call(client, "memory_save", user_message="I moved to Ghent.", assistant_message="Noted.")
    recent = await call(client, "memory_recent", limit=50)
    contents = [m["content"] for m in recent["memories"]]
    assert "The user's bike is a green Gazelle." in contents and "User: I moved to Ghent.\nAssistant: Noted." in contents
    assert not [c for c in contents if seeded.bob.secret in c]
    # Bob's ids are not alice's to forget; a phrase asks first; the token deletes.
    assert (await call(client, "memory_forget", target=seeded.bob.memory_id))["action"] == "not_found"
    listed = await call(client, "memory_forget", target="green Gazelle")
    assert listed["action"] == "confirm" and [c["memory_id"] for c in listed["candidates"]] == [saved["memory_id"]]
    done = await call(client, "memory_forget", confirmation_token=listed["confirmation_token"])
    assert done["action"] == "deleted" and done["deleted_memory_ids"] == [saved["memory_id"]]
    gone = await call(client, "memory_forget", target=exchange["memory_id"])
    assert gone["deleted_memory_ids"] == [exchange["memory_id"]]
    assert "either a target" in await refused(client, "memory_forget")
    assert "not both" in await refused(client, "memory_save", fact="x", user_message="y", assistant_message="z")
    assert "NUL" in await refused(client, "memory_save", fact="a\x00b")
    return saved


def bob_untouched(database: Database, seeded: Seeded) -> None:  # noqa: F811
    """Bob still has his three seeded memories and no new ones."""
    assert fetch_one(database, "SELECT count(*) FROM memories WHERE user_id = 'bob' AND deleted_at IS NULL")[0] == 3


@pytest.fixture
def mcp_url(api_settings: Settings, database: Database) -> Any:  # noqa: F811
    """``yak mcp --http`` as an app under uvicorn; yields (url, services)."""
    services = ApiServices.of(api_settings, database=database)
    with serve_in_thread(mcp_http_app(services)) as url:
        yield f"{url}{MCP_PATH}", services


def http_client(url: str, key: str | None) -> Client:
    """The SDK's client over streamable HTTP, sending ``key`` as a bearer token."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return Client(streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers, timeout=30)))


def test_every_tool_over_streamable_http_reaches_only_the_keys_user(
        mcp_url: Any, seeded: Seeded, database: Database) -> None:  # noqa: F811
    url, services = mcp_url

    async def main() -> None:
        async with http_client(url, seeded.alice_key) as alice:
            await exercise_alice(alice, seeded)
        async with http_client(url, seeded.bob_key) as bob:
            found = await call(bob, "memory_search", query="What is my locker code?", threshold=0.1)
            texts = " ".join(m["content"] for m in found["memories"])
            assert seeded.bob.secret in texts and seeded.alice.secret not in texts
        async with http_client(url, ADMIN_KEY) as admin:
            assert "use a key scoped to one user" in await refused(admin, "memory_recent")

    anyio.run(main)
    bob_untouched(database, seeded)
    actors = {r[0] for r in fetch_all(database, "SELECT actor FROM audit_log WHERE action = 'ingest'")}
    assert any(a.startswith("mcp:key:") for a in actors)
    services.metrics.flush(database)
    with database.connection() as conn:
        counts = read_metrics(conn, queue_sizes={}).counters["yak_mcp_tool_calls_total"]
    assert counts[(("outcome", "ok"), ("tool", "memory_search"))] == 2
    assert counts[(("outcome", "refused"), ("tool", "memory_recent"))] == 1


def test_saving_again_what_the_user_forgot_softly_is_refused_with_the_reason(
        mcp_url: Any, seeded: Seeded, database: Database) -> None:  # noqa: F811
    # A soft forget keeps the row, hidden, and one row per user and text: the same text cannot be
    # saved again, and the tool says why instead of failing with an internal error.
    url, _ = mcp_url
    report = forget_memory(database, seeded.alice.memory_id, user_id="alice", actor="test", soft=True)
    assert report is not None

    async def main() -> None:
        async with http_client(url, seeded.alice_key) as alice:
            reason = await refused(alice, "memory_save", user_message="My locker code is AZURE-7731.",
                                   assistant_message="Noted.")
            assert "forgot this exchange" in reason

    anyio.run(main)


def test_http_without_a_valid_key_is_401_before_the_sdk(mcp_url: Any, seeded: Seeded) -> None:  # noqa: F811
    url, _ = mcp_url
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    for headers in ({}, {"X-API-Key": "not-a-yak-key"}, {"Authorization": "Bearer not-a-yak-key"}):
        response = httpx.post(url, json=body, headers={"Accept": "application/json, text/event-stream", **headers})
        assert response.status_code == 401, headers


def test_every_tool_over_stdio_for_one_user(db_url: str, database: Database, seeded: Seeded,  # noqa: F811
                                            tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("YAK_")}
    env.update(YAK_DATABASE_URL=db_url, YAK_EMBEDDER="hashing", YAK_HOME=str(tmp_path / "home"))
    # `python -m` from the project folder: the subprocess runs this checkout's code.
    params = StdioServerParameters(command=sys.executable, args=["-m", "yak_pipeline.cli.main", "mcp", "--user", "alice"],
                                   env=env, cwd=str(ROOT))

    async def main() -> None:
        async with Client(params, read_timeout_seconds=60) as alice:
            await exercise_alice(alice, seeded)

    anyio.run(main)
    bob_untouched(database, seeded)
    actors = {r[0] for r in fetch_all(database, "SELECT actor FROM audit_log WHERE action = 'ingest'")}
    assert "mcp:stdio" in actors
