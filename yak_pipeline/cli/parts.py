"""What the ``yak`` root callback hands every command in the Typer context (``ctx.obj``).

The root callback (:func:`yak_pipeline.cli.main.root`) is the CLI's one reader of the settings: it
gives :class:`CliParts` the function that reads them. Nothing is built up front: a command that
only talks to a running server needs three values (:class:`~.config.ClientSettings`, read without
pydantic when the environment surely is valid), and a command that opens the database or loads
the embedder builds those parts (:class:`yak_pipeline.wiring.YakParts`) when it first asks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from yak_pipeline.cli.config import ClientSettings, quick_client_settings

if TYPE_CHECKING:  # pydantic and the store are imported when a command first needs them
    import typer

    from yak_pipeline.settings import Settings
    from yak_pipeline.wiring import YakParts


class CliParts:
    """The settings and parts of one ``yak`` command, each read or built on first use."""

    def __init__(self, client: ClientSettings, read_settings: Callable[[], Settings]) -> None:
        self.client = client
        self._read_settings = read_settings
        self._parts: YakParts | None = None

    @classmethod
    def start(cls, read_settings: Callable[[], Settings]) -> CliParts:
        """The parts of a command, the client's settings read now.

        Without pydantic when every ``YAK_*`` value is surely valid (:func:`.config.quick_client_settings`);
        else the full settings are read now, so a bad value fails (``SettingsError``) before any work.
        """
        quick = quick_client_settings()
        if quick is not None:
            return cls(quick, read_settings)
        return cls(_client_of(read_settings()), read_settings)

    @classmethod
    def of(cls, settings: Settings) -> CliParts:
        """The parts of a command run with ``settings`` (the tests' explicit ones: ``obj=`` of ``invoke``)."""
        return cls(_client_of(settings), lambda: settings)

    @property
    def settings(self) -> Settings:
        """The full settings (pydantic imported now, the first time)."""
        return self._read_settings()

    @property
    def parts(self) -> YakParts:
        """Yak's parts for these settings (:func:`yak_pipeline.wiring.build_parts`), each built on first use."""
        if self._parts is None:
            from yak_pipeline.wiring import build_parts

            self._parts = build_parts(self.settings)
        return self._parts


def _client_of(settings: Settings) -> ClientSettings:
    """What a command needs to find and talk to a running server, from the full settings."""
    key = settings.admin_api_key
    return ClientSettings(home=settings.home, api_url=settings.api_url,
                          admin_api_key=None if key is None else key.get_secret_value())


def cli_parts(ctx: typer.Context) -> CliParts:
    """The :class:`CliParts` the root callback put in a command's ``ctx``."""
    found = ctx.find_object(CliParts)
    if found is None:
        raise RuntimeError("no CliParts in the Typer context: run the command through the `yak` app")
    return found
