"""`yak <command>` builds only that command (``main.app_for``), and nothing a person sees changes.

Typer builds every command's click command before it reads an argument; ``yak`` runs a copy of
the app holding just the command its first argument names. Its help, usage lines and errors
must be those of the whole app, and everything else (no argument, ``--help``, an unknown name)
must get the whole app.
"""

from __future__ import annotations

import typer.main
from typer.testing import CliRunner

from yak_pipeline.cli.main import app, app_for

ROOT = typer.main.get_command(app)


def _paths() -> list[list[str]]:
    """Every command path under the root: ``[name]`` and, for a group, ``[name, sub]``."""
    paths = []
    for name, command in sorted(ROOT.commands.items()):
        paths.append([name])
        paths.extend([name, sub] for sub in sorted(getattr(command, "commands", {})))
    return paths


def test_each_command_is_run_from_an_app_holding_only_it() -> None:
    for name in ROOT.commands:
        one = typer.main.get_command(app_for([name, "--help"]))
        assert list(one.commands) == [name]


def test_each_commands_help_and_usage_errors_are_the_whole_apps() -> None:
    runner = CliRunner()
    for path in _paths():
        # Every help page; the usage error of each command and group (a sub-command's is click's alike).
        for args in ([*path, "--help"], *([[*path, "--no-such-option"]] if len(path) == 1 else [])):
            whole = runner.invoke(app, args, prog_name="yak")
            alone = runner.invoke(app_for(args), args, prog_name="yak")
            assert (alone.exit_code, alone.output) == (whole.exit_code, whole.output), args


def test_no_argument_an_option_first_or_an_unknown_name_get_the_whole_app(monkeypatch) -> None:  # noqa: ANN001
    for argv in ([], ["--help"], ["nosuch"], ["--install-completion"]):
        assert app_for(argv) is app
    monkeypatch.setenv("_YAK_COMPLETE", "bash_complete")  # shell completion lists every command
    assert app_for(["memory"]) is app
