"""One shape for the commands that make one API request and print its answer.

Most ``yak`` commands over the API do the same three things: build one request from their
arguments, send it (to a running server or the app in this process, :mod:`.api_client`), and
print the answer as JSON for scripts (``--json``) or rendered for people. A command written with
:func:`api_command` only builds the request — an :class:`ApiCall` — and the decorator adds the
``--remote``, ``--api-key`` and ``--json`` options, the sending, the printing and the one-line
errors (:func:`.errors.friendly_errors`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import typer

from yak_pipeline.cli.api_client import ApiKeyOption, JsonOption, RemoteOption, call_api, emit
from yak_pipeline.cli.errors import friendly_errors


@dataclass(frozen=True)
class ApiCall:
    """One request to the API and how to show its answer to people."""

    method: str
    path: str
    render: Callable[[Any], None]
    json_body: Any = None
    params: dict | None = None


def call_and_print(ctx: typer.Context, call: ApiCall, *, remote: str | None, api_key: str | None,
                   as_json: bool) -> None:
    """Send ``call`` and print its answer: JSON for scripts, else ``call.render``."""
    data = call_api(ctx, remote, api_key, call.method, call.path, json_body=call.json_body, params=call.params)
    emit(data, as_json, call.render)


# The options every API command has, after its own (the order `--help` has always shown), and the
# Typer context the root callback put the command's parts in (not an option: Typer fills it in).
_SHELL_OPTIONS = (
    inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context),
    inspect.Parameter("remote", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=RemoteOption),
    inspect.Parameter("api_key", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=ApiKeyOption),
    inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=JsonOption),
)


def api_command(app: typer.Typer, name: str) -> Callable[[Callable[..., ApiCall]], Callable[..., None]]:
    """Register a function returning an :class:`ApiCall` as the command ``name`` of ``app``.

    The function's own parameters stay the command's arguments and options (and its docstring
    its help); the command gets ``--remote``, ``--api-key`` and ``--json`` on top.
    """

    def register(build: Callable[..., ApiCall]) -> Callable[..., None]:
        own = inspect.signature(build, eval_str=True)

        @functools.wraps(build)
        def command(*args: Any, ctx: typer.Context, remote: str | None = None, api_key: str | None = None,
                    as_json: bool = False, **kwargs: Any) -> None:
            call_and_print(ctx, build(*args, **kwargs), remote=remote, api_key=api_key, as_json=as_json)

        # Typer reads a command's options from its signature: the function's, plus the shell's.
        parameters = [*own.parameters.values(), *_SHELL_OPTIONS]
        command.__signature__ = own.replace(parameters=parameters, return_annotation=None)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in parameters}
        return app.command(name)(friendly_errors(command))

    return register
