"""The memory proxy's test fixtures and helpers: Yak (API and proxy) live under uvicorn in front of
the loopback upstream, the real ``openai`` client, and readers of the turns and metrics it stored."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from fastapi import FastAPI
from pydantic import SecretStr

from yak_loopback.openai_server import FakeOpenAIServer
from yak_pipeline.api.app import create_app
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database
from yak_pipeline_tests.api_fixtures import ADMIN_KEY, serve_in_thread
from yak_pipeline_tests.pipeline_helpers import fetch_all

UPSTREAM_KEY = "sk-upstream-secret-5f2a9c"
QUESTION = "What is my locker code?"


@pytest.fixture
def proxy_settings(api_settings: Settings, upstream: FakeOpenAIServer) -> Settings:  # noqa: F811
    """Settings whose upstream is the loopback server (threshold 0.1: the seeded memories are recalled)."""
    return api_settings.model_copy(update={"upstream_base_url": upstream.base_url,
                                           "upstream_api_key": SecretStr(UPSTREAM_KEY),
                                           "proxy_recall_threshold": 0.1, "upstream_timeout_seconds": 2.0})


@pytest.fixture
def yak_app(proxy_settings: Settings, database: Database) -> FastAPI:
    """Yak (API and proxy) on the test's database."""
    return create_app(proxy_settings, database=database)


@pytest.fixture
def yak_url(yak_app: FastAPI) -> Iterator[str]:
    """``yak_app`` live under uvicorn."""
    with serve_in_thread(yak_app) as url:
        yield url


def client(yak_url: str, key: str | None) -> openai.OpenAI:
    """The real OpenAI client pointed at Yak's proxy with ``key`` (no retries: errors show at once)."""
    return openai.OpenAI(base_url=f"{yak_url}/v1", api_key=key or "", max_retries=0, timeout=15)


def chat(system: str = "You are terse.") -> list[dict]:
    """A conversation with history whose last message is the question."""
    return [{"role": "system", "content": system}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": QUESTION}]


def settle(app: FastAPI) -> None:
    """Wait until ``app``'s proxy has stored every turn it answered (it stores them after the response)."""
    assert app.state.services.proxy.turns.wait(timeout=15), "the proxy's turns were not stored in 15 s"


def turns(app: FastAPI, database: Database, user_id: str) -> list[tuple]:
    """The user's turns once ``app`` has stored all it answered: user message, assistant message, recalled ids."""
    settle(app)
    return stored_turns(database, user_id)


def stored_turns(database: Database, user_id: str) -> list[tuple]:
    """The user's turns in the database now: user message, assistant message, recalled ids (as text)."""
    return fetch_all(database, """SELECT user_message, assistant_message, recalled_ids::text[] FROM turns
                                  WHERE user_id = %s ORDER BY created_at""", (user_id,))


def scrape(yak_url: str) -> str:
    """The Prometheus text of ``/metrics``."""
    return httpx.get(f"{yak_url}/metrics", headers={"X-API-Key": ADMIN_KEY}).text


def sample(text: str, line_start: str) -> float:
    """The value of the first sample line starting with ``line_start``."""
    return float(next(line for line in text.splitlines() if line.startswith(line_start)).rsplit(" ", 1)[1])
