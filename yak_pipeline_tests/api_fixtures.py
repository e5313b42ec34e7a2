"""Fixtures for the API and CLI tests: a real app on the test database, keys, and seeded data.

Test modules import the fixtures they use from here (``from yak_pipeline_tests.api_fixtures
import ...``), so pytest finds them without a shared conftest.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from uuid import UUID

import psycopg
import pytest
import uvicorn
from pydantic import SecretStr
from starlette.testclient import TestClient

from yak_pipeline.api.app import create_app
from yak_pipeline.settings import Settings
from yak_pipeline.store.api_keys import create_api_key
from yak_pipeline.store.conflicts import record_conflict
from yak_pipeline.store.database import Database
from yak_pipeline.store.turns import insert_turn
from yak_pipeline.store.warmth import apply_relevance
from yak_pipeline_tests.store_helpers import seed_memory_with_distillation

ADMIN_KEY = "test-admin-key-0123456789abcdef"


@contextmanager
def serve_in_thread(app) -> Iterator[str]:  # noqa: ANN001 - an ASGI app
    """``app`` under uvicorn on a free port of 127.0.0.1; yields its base URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="yak-test-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    """The test's settings with a configured admin key."""
    return settings.model_copy(update={"admin_api_key": SecretStr(ADMIN_KEY)})


@pytest.fixture
def app(api_settings: Settings, database: Database):  # noqa: ANN201 - FastAPI
    """The real app on the test's database (hashing embedder, rules LLM)."""
    return create_app(api_settings, database=database)


def client_with(app, key: str | None) -> TestClient:  # noqa: ANN001
    """A TestClient sending ``key`` (no header when None); server errors come back as responses."""
    return TestClient(app, raise_server_exceptions=False, headers={"X-API-Key": key} if key else {})


@pytest.fixture
def admin(app) -> Iterator[TestClient]:  # noqa: ANN001
    """A client with the admin key."""
    with client_with(app, ADMIN_KEY) as client:
        yield client


@dataclass(frozen=True)
class UserData:
    """One seeded user's rows."""

    user_id: str
    memory_id: str
    distillation_id: str
    review_id: str
    other_distillation_id: str
    conflict_id: str
    turn_id: str
    secret: str


@dataclass(frozen=True)
class Seeded:
    """Two users with memories, distillations (one awaiting review), a conflict, a turn, warmth events."""

    alice: UserData
    bob: UserData
    alice_key: str
    bob_key: str


def _seed_user(conn: psycopg.Connection, user_id: str, secret: str) -> UserData:
    when = datetime.now(UTC) - timedelta(days=1)
    memory_id, distillation_id = seed_memory_with_distillation(
        conn, user_id=user_id, exchange=f"User: My locker code is {secret}.\nAssistant: Noted.",
        distillation=f"The user's locker code is {secret}.", tier="core", occurred_at=when)
    _, other_id = seed_memory_with_distillation(
        conn, user_id=user_id, exchange=f"User: My locker code is not {secret}.\nAssistant: Noted.",
        distillation=f"The user's locker code is not {secret}.", occurred_at=when)
    _, review_id = seed_memory_with_distillation(
        conn, user_id=user_id, exchange=f"User: Maybe I like {secret} tea?\nAssistant: Maybe.",
        distillation=f"The user may like {secret} tea.", confidence=0.5, occurred_at=when)
    conflict_id = record_conflict(conn, user_id=user_id, a=distillation_id, b=other_id, score=0.9)
    turn_id = insert_turn(conn, user_id=user_id, user_message=f"What is my {secret} code?",
                          assistant_message="It is in your memories.", recalled_ids=[distillation_id],
                          memory_id=memory_id)
    apply_relevance(conn, distillation_id, relevance_score=0.9, reason="turn", turn_id=turn_id, evaluator="test")
    return UserData(user_id, str(memory_id), str(distillation_id), str(review_id), str(other_id), str(conflict_id),
                    str(turn_id), secret)


@pytest.fixture
def seeded(database: Database) -> Seeded:
    """Alice's and Bob's data, and a key scoped to each."""
    with database.connection() as conn:
        alice = _seed_user(conn, "alice", "AZURE-7731")
        bob = _seed_user(conn, "bob", "CRIMSON-4402")
        _, alice_key = create_api_key(conn, user_id="alice", label="test")
        _, bob_key = create_api_key(conn, user_id="bob", label="test")
    return Seeded(alice, bob, alice_key, bob_key)


def rows_mentioning(conn: psycopg.Connection, needle: str, *, skip: tuple[str, ...] = ()) -> dict[str, int]:
    """Per table of the public schema, how many rows contain ``needle`` anywhere in their text form."""
    tables = [r[0] for r in conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename").fetchall()]
    found = {}
    for table in tables:
        if table in skip:
            continue
        count = conn.execute(
            f'SELECT count(*) FROM "{table}" t WHERE strpos(t::text, %s) > 0', (needle,)  # noqa: S608 - catalog names
        ).fetchone()[0]
        if count:
            found[table] = count
    return found


def as_uuid(value: str) -> UUID:
    """A UUID from its string form."""
    return UUID(value)
