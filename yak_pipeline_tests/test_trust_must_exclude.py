"""What must never come back (issue 35, part 4), PrecisionMemBench-style, through real processes.

A real ``yak serve`` (API and memory proxy at ``/v1``) and a served MCP app on one database:

- a forgotten memory is gone, within a second of the forget's answer, from search, context,
  the proxy's block, MCP's search and recent list, MEMORY.md, and then from a ``yak export``
  backup (mem0 #3695 and #5066: deleted memories still returned; MemOS #2331: vectors left);
- ten users share the database; a thousand mixed requests (writes, searches, context, lists,
  MEMORY.md, proxied chats, and attempts to name another user in the body, the query, the
  proxy's ``user`` field) never answer with another user's text (AIOS #551: ``user_id`` as a hint).

Other must-exclude cases live beside the code they guard: every route's isolation and forget
sequences (test_reliability_isolation.py), every recall leg after a forget
(test_recallable_at_once.py), superseded memories in the block (test_recall_engine.py), MCP
and proxy scoping (test_mcp.py, test_proxy.py); docs/RELIABILITY.md lists them.
"""

from __future__ import annotations

import json
import random
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import httpx
import httpx2
import openai
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from yak_loopback.openai_replies import chat_replier
from yak_loopback.openai_server import FakeOpenAIServer
from yak_pipeline.api.dependencies import ApiServices
from yak_pipeline.api.mcp_server import MCP_PATH, mcp_http_app
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline_tests.api_fixtures import serve_in_thread
from yak_pipeline_tests.reliability_helpers import YAK, report_figure, yak_env, yak_serve

ADMIN_KEY = "adm-trust-35-exclude-key"
FORGOTTEN = "My safe deposit box is number 7741 at the Okonkwo branch."
KEPT = "My safe has a brass handle and sits in the study."


async def _mcp_texts(url: str, key: str, query: str) -> str:
    headers = {"Authorization": f"Bearer {key}"}
    async with Client(streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers, timeout=30))) as mcp:
        found = await mcp.call_tool("memory_search", {"query": query, "threshold": 0.0, "limit": 50})
        recent = await mcp.call_tool("memory_recent", {"limit": 50})
        assert not found.is_error and not recent.is_error
        return json.dumps([found.structured_content, recent.structured_content])


def test_a_forgotten_memory_is_gone_from_every_read_path_within_a_second(
        db_url: str, database: Database, settings: Settings, tmp_path: Path) -> None:
    with FakeOpenAIServer(chat_replier) as upstream:
        env = yak_env(db_url, tmp_path / "home", YAK_ADMIN_API_KEY=ADMIN_KEY, YAK_UPSTREAM_BASE_URL=upstream.base_url,
                      YAK_PROXY_RECALL_THRESHOLD="0", YAK_RECALL_BLOCK_ODDS_GAP="100")
        services = ApiServices.of(settings.model_copy(update={"admin_api_key": None}),
                               database=Database(db_url, max_size=2).open())
        with yak_serve(env, tmp_path) as server, serve_in_thread(mcp_http_app(services)) as mcp_base, \
                httpx.Client(base_url=server.url, timeout=60) as api:
            key = api.post("/api/keys", headers={"X-API-Key": ADMIN_KEY},
                           json={"user_id": "sam", "label": "exclude"}).json()["key"]
            headers = {"X-API-Key": key}
            proxy = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=30)
            question = "Where is my safe deposit box?"
            memory_id = api.post("/api/memories/", headers=headers, json={
                "user_id": "sam", "content": f"User: {FORGOTTEN}\nAssistant: Noted."}).json()["id"]
            api.post("/api/memories/", headers=headers, json={"user_id": "sam", "content": f"User: {KEPT}\nAssistant: ok"})
            # Distilled too (offline rules provider), so MEMORY.md and the distillation legs hold it.
            processed = subprocess.run([str(YAK), "process", "--json"], env=env, capture_output=True, text=True,
                                       timeout=600, check=False)
            assert processed.returncode == 0, processed.stderr[-3000:]

            def everything() -> dict[str, str]:
                """What every read path answers for sam now."""
                proxy.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": question}])
                return {
                    "search": api.post("/api/distillations/search", headers=headers,
                                       json={"user_id": "sam", "query": question, "threshold": 0.0}).text,
                    "context": api.post("/api/context", headers=headers,
                                        json={"user_id": "sam", "query": question, "threshold": 0.0}).text,
                    "list": api.get("/api/memories", headers=headers).text,
                    "memory.md": api.get("/api/export/memory.md", headers=headers).text,
                    "proxy block": json.dumps(upstream.chat_requests[-1].body["messages"]),
                    "mcp": anyio.run(_mcp_texts, f"{mcp_base}{MCP_PATH}", key, question),
                }

            before = everything()
            assert {name for name, text in before.items() if "Okonkwo" in text} == set(before)  # found everywhere
            forgot = api.delete(f"/api/memories/{memory_id}", headers=headers)
            forgotten_at = time.monotonic()
            assert forgot.status_code == 200
            after = everything()
            took = time.monotonic() - forgotten_at
            assert {name for name, text in after.items() if "Okonkwo" in text or memory_id in text} == set()
            assert all("brass handle" in after[name] for name in ("search", "list", "mcp"))  # the rest stays
            assert took < 1.0 + 2.0  # every path asked right away (the proxy chat and MCP session take their time)
            backup = tmp_path / "backup.jsonl"
            exported = subprocess.run([str(YAK), "export", "--user", "sam", "--format", "jsonl", "--output", str(backup)],
                                      env=env, capture_output=True, text=True, timeout=120, check=False)
            assert exported.returncode == 0, exported.stderr[-2000:]
            assert "Okonkwo" not in backup.read_text() and "brass handle" in backup.read_text()
    report_figure("forgotten memory on every read path",
                  f"6 read paths, all answered within {took * 1000:.0f} ms of the forget's answer: 0 returned it; backup: 0")


@pytest.mark.slow
def test_ten_users_a_thousand_mixed_requests_no_cross_user_text(db_url: str, database: Database,
                                                                tmp_path: Path) -> None:
    users = [f"user{i:02d}" for i in range(10)]
    marker = {u: f"zorblax{u}token" for u in users}  # one word only this user ever said
    with FakeOpenAIServer(chat_replier) as upstream:
        env = yak_env(db_url, tmp_path / "home", YAK_ADMIN_API_KEY=ADMIN_KEY, YAK_UPSTREAM_BASE_URL=upstream.base_url,
                      YAK_PROXY_RECALL_THRESHOLD="0", YAK_RECALL_BLOCK_ODDS_GAP="100")
        with yak_serve(env, tmp_path) as server, httpx.Client(base_url=server.url, timeout=120) as admin:
            keys = {u: admin.post("/api/keys", headers={"X-API-Key": ADMIN_KEY},
                                  json={"user_id": u, "label": "load"}).json()["key"] for u in users}
            for u in users:  # the same texts for everyone, and each user's own marker
                for fact in ("I have a dog called Pepper.", f"My codeword is {marker[u]}.", "I live by the sea."):
                    admin.post("/api/memories/", headers={"X-API-Key": keys[u]},
                               json={"user_id": u, "content": f"User: {fact}\nAssistant: ok"})
            rng = random.Random(35)
            plan = [(rng.choice(users), rng.choice(users), rng.random()) for _ in range(1000)]

            def request(step: tuple[str, str, float]) -> tuple[str, str, int, str]:
                me, other, roll = step
                headers = {"X-API-Key": keys[me]}
                with httpx.Client(base_url=server.url, timeout=120, headers=headers) as api:
                    if roll < 0.15:
                        r = api.post("/api/memories/", json={"user_id": me, "content": f"User: note {rng.random()} "
                                                             f"{marker[me]}\nAssistant: ok"})
                    elif roll < 0.40:
                        r = api.post("/api/distillations/search", json={"user_id": me, "query": "codeword dog sea",
                                                                        "threshold": 0.0, "limit": 50})
                    elif roll < 0.55:
                        r = api.post("/api/context", json={"user_id": me, "query": "what is my codeword?",
                                                           "threshold": 0.0})
                    elif roll < 0.65:
                        r = api.get("/api/memories", params={"limit": 200})
                    elif roll < 0.72:
                        r = api.get("/api/export/memory.md")
                    elif roll < 0.80:  # another user named in the body: refused
                        r = api.post("/api/distillations/search", json={"user_id": other, "query": "codeword"})
                    elif roll < 0.86:  # …in the query
                        r = api.get("/api/memories", params={"user_id": other})
                    elif roll < 0.90:
                        r = api.get("/api/export/memory.md", params={"user_id": other})
                    else:  # the proxy, with another user in its `user` field
                        r = api.post("/v1/chat/completions", json={
                            "model": "fake-model", "user": other,
                            "messages": [{"role": "user", "content": "what is my codeword?"}]})
                    return me, other, r.status_code, r.text

            with ThreadPoolExecutor(max_workers=4) as pool:
                answers = list(pool.map(request, plan))
            blocks = [json.dumps(r.body["messages"]) for r in upstream.chat_requests]
    cross = [(me, status, text[:200]) for me, _, status, text in answers
             for u in users if u != me and marker[u] in text]
    statuses = sorted({status for _, _, status, _ in answers})
    block_leaks = [b[:200] for b in blocks if sum(marker[u] in b for u in users) > 1]
    report_figure("ten users, mixed requests", f"{len(answers)} requests, statuses {statuses}, "
                  f"{len(blocks)} proxied blocks: {len(cross)} answers and {len(block_leaks)} blocks with another user's text")
    assert len(answers) == 1000 and not [s for s in statuses if s >= 500]
    assert cross == [] and block_leaks == []
    # Naming another user was refused (or, for the proxy, ignored): never answered with their data.
    named_other = [status for me, other, status, _ in answers if other != me]
    assert set(named_other) <= {200, 201, 403}
