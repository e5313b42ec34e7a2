"""No private text in logs (issue 35, part 2).

A real ``yak serve`` stores memories, answers searches, context requests, turns, proxied chats
and bad requests, all carrying distinctive words; not one of those words reaches its stdout or
stderr. The access log is off by default; turned on (``YAK_ACCESS_LOG``), its lines keep the
method, path and status but never a query string.
"""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import openai

from yak_loopback.openai_replies import chat_replier
from yak_loopback.openai_server import FakeOpenAIServer
from yak_pipeline.api.access_log import DropQueryStrings
from yak_pipeline.llm.errors import reason_for_log
from yak_pipeline.store.database import Database
from yak_pipeline_tests.reliability_helpers import yak_env, yak_serve

ADMIN_KEY = "adm-trust-35-logs-key"
# Words nobody's log would hold by chance: each request below carries some of them.
WORDS = ("quetzalcoatl", "zanzibarine", "frobnicated", "marzipanic", "glockenspielery", "thunderquail")


def _exercise(url: str) -> None:
    """Writes, reads and failures with the distinctive words, as a user would make them."""
    admin = {"X-API-Key": ADMIN_KEY}
    with httpx.Client(base_url=url, timeout=60) as api:
        key = api.post("/api/keys", headers=admin, json={"user_id": "sam", "label": "logs"}).json()["key"]
        user = {"X-API-Key": key}
        assert api.post("/api/memories/", headers=user, json={
            "user_id": "sam", "content": f"User: I keep a {WORDS[0]} named {WORDS[1]}.\nAssistant: Lovely."}
        ).status_code == 201
        assert api.post("/api/turns", headers=user, json={
            "user_id": "sam", "user_message": f"Is my {WORDS[2]} kettle fixed?", "assistant_message": "Not yet."}
        ).status_code == 202
        assert api.post("/api/distillations/search", headers=user,
                        json={"user_id": "sam", "query": f"what about my {WORDS[0]}?"}).status_code == 200
        assert api.post("/api/context", headers=user,
                        json={"user_id": "sam", "query": f"tell me about {WORDS[3]}"}).status_code == 200
        # Bad input and someone else's key: the errors name ids and fields, not the text.
        assert api.post("/api/memories/", headers=user,
                        json={"user_id": "sam", "content": f"{WORDS[4]}\x00"}).status_code == 422
        assert api.post("/api/memories/", headers={"X-API-Key": "wrong"},
                        json={"user_id": "sam", "content": WORDS[4]}).status_code == 401
        api.get(f"/ui/u/sam/search?q={WORDS[5]}+what+should+I+cook")
        proxy = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=30)
        proxy.chat.completions.create(model="fake-model",
                                      messages=[{"role": "user", "content": f"Where is my {WORDS[0]}?"}])


def test_a_served_yak_logs_no_memory_or_search_text(db_url: str, database: Database, tmp_path: Path) -> None:
    with FakeOpenAIServer(chat_replier) as upstream:
        env = yak_env(db_url, tmp_path / "home", YAK_ADMIN_API_KEY=ADMIN_KEY, YAK_UPSTREAM_BASE_URL=upstream.base_url)
        with yak_serve(env, tmp_path) as server:
            _exercise(server.url)
        logs = server.logs()
    assert logs.strip()  # it did log (start-up, shutdown)…
    assert [w for w in WORDS if w in logs.lower()] == []  # …none of what people said
    assert "GET /health" not in logs and "POST /api/memories" not in logs  # no access lines by default


def test_the_access_log_when_asked_for_has_no_query_strings(db_url: str, database: Database, tmp_path: Path) -> None:
    env = yak_env(db_url, tmp_path / "home", YAK_ADMIN_API_KEY=ADMIN_KEY, YAK_ACCESS_LOG="true")
    with yak_serve(env, tmp_path) as server:
        httpx.get(f"{server.url}/ui/u/sam/search?q={WORDS[5]}+what+should+I+cook", timeout=30)
        httpx.get(f"{server.url}/health?probe={WORDS[2]}", timeout=30)
    logs = server.logs()
    assert "GET /ui/u/sam/search HTTP/1.1" in logs and "GET /health HTTP/1.1" in logs
    assert WORDS[5] not in logs and WORDS[2] not in logs and "?q=" not in logs


def test_the_filter_cuts_only_the_query_string() -> None:
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5", "GET", "/ui/u/sam/search?q=secret+words", "1.1", 200), None)
    assert DropQueryStrings().filter(record) and record.getMessage() == \
        '127.0.0.1:5 - "GET /ui/u/sam/search HTTP/1.1" 200'


def test_an_llm_reason_in_a_log_line_does_not_quote_the_reply() -> None:
    reason = "reply is not JSON (Expecting value at char 0): 'Sure! The user keeps a quetzalcoatl'"
    assert reason_for_log(reason) == "reply is not JSON (Expecting value at char 0): <the reply is not shown>"
    assert reason_for_log("confidence 2 is outside [0, 1]") == "confidence 2 is outside [0, 1]"
