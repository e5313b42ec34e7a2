"""Read-only keys (issue 35, part 5): recall and search, never write or forget.

One read-only key for a user with memories goes through a real ``yak serve`` (API and memory
proxy) and a served MCP app: its reads answer as a normal key's would; every write and forget
is refused (403, a tool error, "Nothing was forgotten"), and the database shows nothing changed.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import anyio
import httpx
import httpx2
import openai
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from yak_loopback.openai_replies import chat_replier
from yak_loopback.openai_server import FakeOpenAIServer
from yak_pipeline.api.dependencies import ApiServices
from yak_pipeline.api.mcp_server import MCP_PATH, mcp_http_app
from yak_pipeline.settings import Settings
from yak_pipeline.store.api_keys import create_api_key
from yak_pipeline.store.database import Database
from yak_pipeline_tests.api_fixtures import Seeded, api_settings, app, seeded, serve_in_thread  # noqa: F401
from yak_pipeline_tests.reliability_helpers import YAK, yak_env, yak_serve
from yak_pipeline_tests.test_web_page import signed_in

ADMIN_KEY = "adm-trust-35-readonly-key"
READ_ONLY = "this API key is read-only: it can recall and search, not write or forget"


def _counts(database: Database) -> tuple[int, int, int]:
    with database.connection() as conn:
        return (conn.execute("SELECT count(*) FROM memories WHERE deleted_at IS NULL").fetchone()[0],
                conn.execute("SELECT count(*) FROM turns").fetchone()[0],
                conn.execute("SELECT count(*) FROM audit_log WHERE action <> 'key_create'").fetchone()[0])


async def _mcp(url: str, key: str, memory_id: str) -> tuple[list[str], list[str]]:
    headers = {"Authorization": f"Bearer {key}"}
    async with Client(streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers, timeout=30))) as mcp:
        found = await mcp.call_tool("memory_search", {"query": "Which bike do I ride?", "threshold": 0.0})
        recent = await mcp.call_tool("memory_recent", {"limit": 5})
        saved = await mcp.call_tool("memory_save", {"fact": "The user rides a red bike."})
        forgot = await mcp.call_tool("memory_forget", {"target": memory_id})
    assert not found.is_error and not recent.is_error
    texts = [m["content"] for m in found.structured_content["memories"]]
    return texts, [r.content[0].text for r in (saved, forgot) if r.is_error]


def test_a_read_only_key_reads_everywhere_and_writes_nowhere(db_url: str, database: Database, settings: Settings,
                                                            tmp_path: Path) -> None:
    with FakeOpenAIServer(chat_replier) as upstream:
        env = yak_env(db_url, tmp_path / "home", YAK_ADMIN_API_KEY=ADMIN_KEY, YAK_UPSTREAM_BASE_URL=upstream.base_url,
                      YAK_PROXY_RECALL_THRESHOLD="0")
        with yak_serve(env, tmp_path) as server, httpx.Client(base_url=server.url, timeout=60) as api:
            admin = {"X-API-Key": ADMIN_KEY}
            memory = api.post("/api/memories/", headers=admin, json={
                "user_id": "sam", "content": "User: I ride a green Gazelle bike.\nAssistant: Nice."}).json()
            created = subprocess.run([str(YAK), "keys", "create", "--user", "sam", "--read-only", "--json"],
                                     env={**env, "YAK_API_URL": server.url, "YAK_API_KEY": ADMIN_KEY},
                                     capture_output=True, text=True, timeout=120, check=False)
            assert created.returncode == 0, created.stderr
            assert '"read_only": true' in created.stdout
            key = created.stdout.split('"key": "')[1].split('"')[0]
            reader = {"X-API-Key": key}
            before = _counts(database)

            # Reads: as any key of sam's.
            assert api.get("/api/memories", headers=reader).json()["items"][0]["id"] == memory["id"]
            assert api.get(f"/api/memories/{memory['id']}", headers=reader).status_code == 200
            searched = api.post("/api/distillations/search", headers=reader,
                                json={"user_id": "sam", "query": "Which bike do I ride?", "threshold": 0.0})
            assert searched.status_code == 200 and "Gazelle" in searched.text
            assert api.post("/api/context", headers=reader,
                            json={"user_id": "sam", "query": "my bike?"}).status_code == 200
            assert api.get("/api/export/memory.md", headers=reader).status_code == 200

            # Writes and forgets: 403 with one line, whatever the route.
            refused = [
                api.post("/api/memories/", headers=reader, json={"user_id": "sam", "content": "User: x\nAssistant: y"}),
                api.post("/api/turns", headers=reader,
                         json={"user_id": "sam", "user_message": "hi", "assistant_message": "hello"}),
                api.delete(f"/api/memories/{memory['id']}", headers=reader),
                api.post("/api/forget", headers=reader, json={"user_id": "sam", "command": f"/forget {memory['id']}"}),
            ]
            assert [(r.status_code, r.json()["detail"]) for r in refused] == [(403, READ_ONLY)] * 4

            # The proxy: recalled for and answered, but no turn stored and no forget.
            proxy = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=30)
            proxy.chat.completions.create(model="fake-model",
                                          messages=[{"role": "user", "content": "Which bike do I ride?"}])
            assert "Gazelle" in str(upstream.chat_requests[-1].body["messages"])
            forget = proxy.chat.completions.create(model="fake-model",
                                                   messages=[{"role": "user", "content": f"/forget {memory['id']}"}])
            assert forget.choices[0].message.content == "Nothing was forgotten: this API key is read-only."

            services = ApiServices.of(settings.model_copy(update={"admin_api_key": None}),
                                   database=Database(db_url, max_size=2).open())
            with serve_in_thread(mcp_http_app(services)) as mcp_url:
                texts, tool_errors = anyio.run(_mcp, f"{mcp_url}{MCP_PATH}", key, memory["id"])
            assert any("Gazelle" in t for t in texts)
            assert len(tool_errors) == 2 and all(e.endswith(READ_ONLY) for e in tool_errors), tool_errors
            time.sleep(0.5)  # the proxy stores a turn just after answering: give it the chance it must not take
            after = _counts(database)
    assert after == before  # not a memory, turn or audited change more


def test_the_web_page_shows_a_read_only_key_its_user_and_refuses_its_forms(app, seeded: Seeded,  # noqa: ANN001, F811
                                                                          database: Database) -> None:
    with database.connection() as conn:
        _, key = create_api_key(conn, user_id="alice", label="tablet", read_only=True)
    client, csrf = signed_in(app, key)
    assert client.get("/ui/u/alice").status_code == 200
    before = _counts(database)
    refused = client.post(f"/ui/u/alice/m/{seeded.alice.memory_id}/forget", data={"csrf_token": csrf})
    assert refused.status_code == 403 and READ_ONLY in refused.text
    assert _counts(database) == before
    assert client.post("/ui/logout", data={"csrf_token": csrf}).status_code == 303  # signing out still works
