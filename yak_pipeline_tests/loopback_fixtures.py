"""The loopback model servers' pytest fixtures (loaded by the project's conftest as a plugin).

``openai_server`` yields a started :class:`~yak_loopback.openai_server.FakeOpenAIServer`,
``upstream`` one that answers chats as a model behind the memory proxy would, and
``anthropic_upstream`` the loopback Messages API (:mod:`yak_loopback.anthropic_server`).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from yak_loopback.anthropic_server import FakeAnthropicServer
from yak_loopback.openai_replies import chat_replier
from yak_loopback.openai_server import FakeOpenAIServer


@pytest.fixture
def openai_server() -> Iterator[FakeOpenAIServer]:
    """A started :class:`FakeOpenAIServer` for one test, stopped afterwards."""
    server = FakeOpenAIServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def upstream() -> Iterator[FakeOpenAIServer]:
    """The loopback model server behind the memory proxy, answering any chat with ``You said: …``."""
    with FakeOpenAIServer(chat_replier) as server:
        yield server


@pytest.fixture
def anthropic_upstream() -> Iterator[FakeAnthropicServer]:
    """The loopback Messages API behind the memory proxy, answering ``You said: …``."""
    with FakeAnthropicServer() as server:
        yield server
