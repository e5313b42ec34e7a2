"""Tables and text for people: ids never wrap (they are copied into the next command)."""

from __future__ import annotations

import os
import sys
from typing import Final

from rich.console import Console
from rich.table import Table

ID_COLUMNS = frozenset({"id", "memory", "distillation", "turn"})
# Off a terminal rich assumes 80 columns, so piped tables folded mid-word and long lines broke;
# piped output gets room for a whole row per line instead (COLUMNS still wins when set).
PIPED_WIDTH: Final = 400


def make_console(*, stderr: bool = False) -> Console:
    """A console for the ``yak`` commands: the terminal's width, or :data:`PIPED_WIDTH` when piped."""
    stream = sys.stderr if stderr else sys.stdout
    piped = not stream.isatty() and not os.environ.get("COLUMNS")
    return Console(stderr=stderr, width=PIPED_WIDTH if piped else None)


def short(text: str, width: int = 80) -> str:
    """``text`` on one line, cut to ``width`` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def table(*headers: str) -> Table:
    """A table whose id columns stay whole and whose other columns fold or shrink instead."""
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
