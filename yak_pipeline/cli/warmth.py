"""``yak warmth``: show a memory's warmth and history, reset one, reset a user's."""

from __future__ import annotations

from typing import Annotated

import typer

from yak_pipeline.cli.api_client import parse_id
from yak_pipeline.cli.api_command import ApiCall, api_command
from yak_pipeline.cli.render import make_console, table

app = typer.Typer(help="Warmth: how useful recalled memories turned out to be.", no_args_is_help=True)
console = make_console()
MemoryId = Annotated[str, typer.Argument(help="Distillation id.")]


def render_warmth(w: dict) -> None:
    """Warmth and its latest changes, for people."""
    console.print(f"{w['memory_id']}: warmth {w['warmth']:.2f}")
    grid = table("when", "reason", "relevance", "change", "after", "evaluator")
    for e in w["history"]:
        relevance = "-" if e["relevance_score"] is None else f"{e['relevance_score']:.2f}"
        grid.add_row(e["created_at"][:19], e["reason"], relevance, f"{e['delta']:+.2f}", f"{e['warmth_after']:.2f}",
                      e["evaluator"] or "-")
    console.print(grid)


@api_command(app, "show")
def show_command(memory_id: MemoryId) -> ApiCall:
    """Show a distillation's warmth and its latest changes."""
    return ApiCall("GET", f"/api/warmth/{parse_id(memory_id, 'memory id')}", render_warmth)


@api_command(app, "reset")
def reset_command(memory_id: MemoryId) -> ApiCall:
    """Set a distillation's warmth back to 0.5."""
    return ApiCall("POST", f"/api/warmth/{parse_id(memory_id, 'memory id')}/reset", render_warmth)


@api_command(app, "bulk-reset")
def bulk_reset_command(
    user: Annotated[str, typer.Option("--user", help="Whose distillations.")],
    memory_ids: Annotated[list[str] | None, typer.Argument(help="Only these distillation ids (default: all).")] = None,
) -> ApiCall:
    """Set warmth back to 0.5 for all of a user's distillations, or the ones given."""
    body = {"user_id": user, "memory_ids": [parse_id(i, "memory id") for i in memory_ids] if memory_ids else None}
    return ApiCall("POST", "/api/warmth/bulk-reset",
                   lambda d: console.print(f"reset warmth of {d['reset']} distillations"), json_body=body)
