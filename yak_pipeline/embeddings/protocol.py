"""The embedder protocol every provider implements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


class EmbeddingError(RuntimeError):
    """An embedder could not produce vectors; the message is one line saying why."""


@runtime_checkable
class Embedder(Protocol):
    """Turns text into unit-length vectors of a fixed size.

    ``model_name`` is stored on every embedded row so that recall only ever compares vectors
    of one model; ``dimensions`` fixes the ``vector(D)`` column at first migration.
    """

    @property
    def model_name(self) -> str: ...

    @property
    def dimensions(self) -> int: ...

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]: ...

    def embed_query(self, text: str) -> list[float]: ...
