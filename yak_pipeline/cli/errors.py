"""Turns the errors a user can cause into one line and an exit code, never a traceback."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Final, ParamSpec, TypeVar

import typer

P = ParamSpec("P")
R = TypeVar("R")

# Configuration and environment problems: the user must change something before retrying.
USAGE_EXIT = 2
# The operation was refused or failed (server said no, record not found).
FAILURE_EXIT = 1

# The errors a user can cause, as (module, class). They are looked up only among the modules
# already imported: an error of a module the command never imported cannot have been raised, and
# importing them all up front (the settings' pydantic, the embedders' factory) cost every command
# about 0.15 s before it began (bench/cli_latency.py).
_USER_ERRORS: Final = (
    ("yak_pipeline.settings", "SettingsError"),
    ("yak_pipeline.store.errors", "StoreError"),
    ("yak_pipeline.embeddings.protocol", "EmbeddingError"),
    ("yak_pipeline.core.types", "InvalidUserId"),
)


def fail(message: str, code: int = FAILURE_EXIT) -> typer.Exit:
    """Print ``message`` as one line on stderr and return the Exit to raise."""
    print(f"error: {message}", file=sys.stderr)
    return typer.Exit(code)


def is_user_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a bad setting, a store refusal, an embedder failure or an invalid user id."""
    for module_name, class_name in _USER_ERRORS:
        module = sys.modules.get(module_name)
        if module is not None and isinstance(exc, getattr(module, class_name)):
            return True
    return False


def friendly_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Decorator for commands: known errors become ``error: …`` on stderr and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except Exception as exc:
            if not is_user_error(exc):
                raise
            raise fail(str(exc), USAGE_EXIT) from None

    return wrapper
