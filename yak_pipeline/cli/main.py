"""The ``yak`` command line: one Typer app with a sub-app per area."""

from __future__ import annotations

import copy
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import typer

from yak_pipeline.cli import context as context_cli
from yak_pipeline.cli import db, history, ops, pipeline, serve
from yak_pipeline.cli import distill as distill_cli
from yak_pipeline.cli import eval as eval_cli
from yak_pipeline.cli import memory as memory_cli
from yak_pipeline.cli import profile as profile_cli
from yak_pipeline.cli import warmth as warmth_cli
from yak_pipeline.cli.errors import USAGE_EXIT, fail
from yak_pipeline.cli.parts import CliParts, cli_parts

if TYPE_CHECKING:
    from yak_pipeline.settings import Settings

app = typer.Typer(
    name="yak",
    help="Yak, a personal memory system for LLMs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
# The order here is the order `yak --help` lists them in.
app.add_typer(db.app, name="db")
pipeline.register(app)
serve.register(app)
app.add_typer(memory_cli.app, name="memory")
app.add_typer(distill_cli.app, name="distill")
app.add_typer(warmth_cli.app, name="warmth")
ops.register(app)
app.add_typer(eval_cli.app, name="eval")
history.register(app)
context_cli.register(app)
app.add_typer(profile_cli.app, name="profile")


@app.callback()
def root(ctx: typer.Context) -> None:
    """Hand every command its settings and parts (``ctx.obj``, :class:`.parts.CliParts`), read and
    built when it first asks; check the settings once up front, so a bad YAK_* value is one line,
    exit 2, before any work.

    The CLI's one reader of the settings. Without pydantic when every YAK_* value is surely valid
    (:func:`.config.quick_client_settings`): a command that only talks to a server never imports it.
    """

    def read_settings() -> Settings:
        from yak_pipeline.settings import get_settings

        return get_settings()

    if isinstance(ctx.obj, CliParts):
        return  # given by the caller (tests run commands with explicit settings)
    try:
        ctx.obj = CliParts.start(read_settings)
    except Exception as exc:
        from yak_pipeline.settings import SettingsError  # imported already when it was raised

        if not isinstance(exc, SettingsError):
            raise
        raise fail(str(exc), USAGE_EXIT) from None


@app.command("settings")
def settings_command(
    ctx: typer.Context,
    markdown: bool = typer.Option(False, "--markdown", help="Print the README's table of variables."),
    as_json: bool = typer.Option(False, "--json", help="Print the effective settings as JSON (secrets hidden)."),
) -> None:
    """Show the effective configuration (secrets hidden), or the table of all YAK_* variables."""
    from yak_pipeline.settings import Settings, settings_table_markdown

    if markdown:
        print(settings_table_markdown())
        return
    effective = json.loads(cli_parts(ctx).settings.model_dump_json())
    if as_json:
        print(json.dumps(effective))
        return
    for name in Settings.model_fields:
        print(f"YAK_{name.upper()}={'' if effective[name] is None else effective[name]}")


def app_for(argv: Sequence[str]) -> typer.Typer:
    """The app to run for ``argv``: the whole app, or one holding only the command ``argv`` names.

    Typer builds the click command of every command before it reads an argument (their
    signatures, annotations and options: 40-100 ms for the 50-odd commands here, more than any
    other part of a command's start, bench/cli_latency.py), and a command needs only its own.
    When ``argv[0]`` names a command or group of the app, the app run is a copy holding just that
    one: the root's callback (so it stays a group, and the settings are still checked first),
    options and name unchanged, so the command's help, errors and usage lines are the same. No
    argument, an option first (``--help``), a name the app does not have (click's error lists
    the app's commands) and shell completion get the whole app.
    """
    if not argv or any(key.startswith("_") and key.endswith("_COMPLETE") for key in os.environ):
        return app
    groups = [group for group in app.registered_groups if group.name == argv[0]]
    commands = [command for command in app.registered_commands if command.name == argv[0]]
    if len(groups) + len(commands) != 1:
        return app
    one = copy.copy(app)
    one.registered_groups, one.registered_commands = groups, commands
    return one


def main() -> None:
    """Console-script entry point."""
    app_for(sys.argv[1:])()


if __name__ == "__main__":
    main()
