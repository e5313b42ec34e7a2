"""Tables and text for people: ids never wrap (they are copied into the next command).

rich is imported when something is first printed through it, not when a command module is
imported: every ``yak`` command imports every command module, and a ``--json`` answer needs no
rich (about 25 ms of each command's start, bench/cli_latency.py).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

ID_COLUMNS = frozenset({"id", "memory", "distillation", "turn"})
# Off a terminal rich assumes 80 columns, so piped tables folded mid-word and long lines broke;
# piped output gets room for a whole row per line instead (COLUMNS still wins when set).
PIPED_WIDTH: Final = 400


def new_console(*, stderr: bool = False) -> Console:
    """A console for the ``yak`` commands: the terminal's width, or :data:`PIPED_WIDTH` when piped."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    piped = not stream.isatty() and not os.environ.get("COLUMNS")
    return Console(stderr=stderr, width=PIPED_WIDTH if piped else None)


class _LazyConsole:
    """Stands for :func:`new_console`'s console, made (and rich imported) on first use."""

    def __init__(self, *, stderr: bool) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    def _real(self) -> Console:
        if self._console is None:
            self._console = new_console(stderr=self._stderr)
        return self._console

    def __getattr__(self, name: str) -> Any:  # noqa: ANN401 - whatever the console's attribute is
        return getattr(self._real(), name)

    # rich's Live (progress bars) enters the console with `with`, which __getattr__ does not reach.
    def __enter__(self) -> Console:
        return self._real().__enter__()

    def __exit__(self, *exc_info: object) -> None:
        self._real().__exit__(*exc_info)


def make_console(*, stderr: bool = False) -> Console:
    """A console for the ``yak`` commands (:func:`new_console`), made when first printed to.

    The width is decided then, from the stream the command prints to.
    """
    # It forwards every attribute to the real console it makes: a Console to every caller.
    return _LazyConsole(stderr=stderr)  # type: ignore[return-value]


def short(text: str, width: int = 80) -> str:
    """``text`` on one line, cut to ``width`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def table(*headers: str) -> Table:
    """A table whose id columns stay whole and whose other columns fold or shrink instead."""
    from rich.table import Table

    result = Table()
    for header in headers:
        if header in ID_COLUMNS:
            result.add_column(header, no_wrap=True, min_width=36)
        else:
            result.add_column(header, overflow="fold")
    return result


def print_page(console: Console, grid: Table, page: dict) -> None:
    """A page of a listing, then how to ask for the next one when there is more."""
    console.print(grid)
    if page["next_offset"] is not None:
        console.print(f"more: --offset {page['next_offset']}")


def type_label(item: dict) -> str:
    """A memory's type for people: ``event 2026-11-24`` for a dated event, ``-`` for an untyped raw hit."""
    memory_type = item.get("memory_type")
    if not memory_type:
        return "-"
    return f"{memory_type} {item['event_on']}" if item.get("event_on") else str(memory_type)
