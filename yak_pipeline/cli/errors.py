"""Turns the errors a user can cause into one line and an exit code, never a traceback."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import typer

from yak_pipeline.core.types import InvalidUserId
from yak_pipeline.embeddings import EmbeddingError
from yak_pipeline.settings import SettingsError
from yak_pipeline.store.errors import StoreError

P = ParamSpec("P")
R = TypeVar("R")

# Configuration and environment problems: the user must change something before retrying.
USAGE_EXIT = 2
# The operation was refused or failed (server said no, record not found).
FAILURE_EXIT = 1


def fail(message: str, code: int = FAILURE_EXIT) -> typer.Exit:
    """Print ``message`` as one line on stderr and return the Exit to raise."""
    print(f"error: {message}", file=sys.stderr)
    return typer.Exit(code)


def friendly_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Decorator for commands: known errors become ``error: …`` on stderr and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except (SettingsError, StoreError, EmbeddingError, InvalidUserId) as exc:
            raise fail(str(exc), USAGE_EXIT) from None

    return wrapper
