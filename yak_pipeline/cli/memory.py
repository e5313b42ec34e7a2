"""``yak memory``: store, list, show, delete and search memories through the API."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from yak_pipeline.cli.api_client import parse_id
from yak_pipeline.cli.api_command import ApiCall, api_command
from yak_pipeline.cli.render import make_console, print_page, short, table, type_label
from yak_pipeline.core.wording import plural

app = typer.Typer(help="Raw memories: add, list, show, delete, search.", no_args_is_help=True)
console = make_console()

UserOption = Annotated[str | None, typer.Option(
    "--user", help="Only this user's memories (an admin key lists every user's without it; a user key, its own).")]


@api_command(app, "add")
def add_command(
    content: Annotated[str, typer.Argument(help='What to remember: a plain sentence the user said ("I moved to Utrecht '
                                                 'in May."), or an exchange as "User: …" and "Assistant: …" lines; '
                                                 '- reads it from stdin.')],
    user: Annotated[str, typer.Option("--user", help="Whose memory it is.")],
    occurred_at: Annotated[str | None, typer.Option("--occurred-at", help="ISO time with zone; default now.")] = None,
) -> ApiCall:
    """Store what the user said as a pending memory (distilled by the pipeline), e.g.
    yak memory add "I moved to Utrecht in May." --user alice"""
    body = {"content": sys.stdin.read() if content == "-" else content, "user_id": user}
    if occurred_at:
        body["occurred_at"] = occurred_at
    return ApiCall("POST", "/api/memories/", lambda d: console.print(f"stored memory {d['id']} ({d['status']})"),
                   json_body=body)


@api_command(app, "list")
def list_command(
    user: UserOption = None,
    status: Annotated[str | None, typer.Option("--status", help="pending, distilled or failed.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500)] = 50,
    offset: Annotated[int, typer.Option("--offset", min=0)] = 0,
) -> ApiCall:
    """List memories, newest exchange first."""
    def render(page: dict) -> None:
        if not page["items"] and offset == 0:
            # An empty table for a mistyped user id looked like an answer; say what it means.
            whose = f"user {user!r} has" if user else "there are"
            console.print(f"{whose} no {status + ' ' if status else ''}memories")
            return
        grid = table("id", "user", "occurred", "status", "content")
        for m in page["items"]:
            grid.add_row(m["id"], m["user_id"], m["occurred_at"][:19], m["status"], short(m["content"], 60))
        print_page(console, grid, page)

    return ApiCall("GET", "/api/memories", render,
                   params={"user_id": user, "status": status, "limit": limit, "offset": offset})


@api_command(app, "show")
def show_command(
    memory_id: Annotated[str, typer.Argument(help="Memory id.")],
) -> ApiCall:
    """Show one memory's full text, state and distillations."""
    def render(m: dict) -> None:
        console.print(f"[bold]{m['id']}[/bold] user {m['user_id']}, {m['status']}, occurred {m['occurred_at']}")
        console.print(m["content"], markup=False, highlight=False)
        if m["last_error"]:
            console.print(f"last error ({m['attempts']} attempts): {m['last_error']}", markup=False)
        grid = table("distillation", "tier", "type", "confidence", "warmth", "status", "content")
        for d in m["distillations"]:
            grid.add_row(d["id"], d["tier"], type_label(d), f"{d['confidence']:.2f}", f"{d['warmth']:.2f}",
                          d["status"], short(d["content"], 60))
        console.print(grid)

    return ApiCall("GET", f"/api/memories/{parse_id(memory_id, 'memory id')}", render)


@api_command(app, "delete")
def delete_command(
    memory_id: Annotated[str, typer.Argument(help="Memory id.")],
    soft: Annotated[bool, typer.Option("--soft", help="Keep the rows, hidden from every read path.")] = False,
) -> ApiCall:
    """Forget one memory and everything derived from it (cascade; an audit row keeps the ids)."""
    return ApiCall("DELETE", f"/api/memories/{parse_id(memory_id, 'memory id')}", lambda d: console.print(
        f"forgot memory {', '.join(d['deleted_memory_ids'])} and "
        f"{plural(len(d['deleted_distillation_ids']), 'distillation')} made from it"),
                   params={"soft": str(soft).lower()})


@api_command(app, "search")
def search_command(
    query: Annotated[str, typer.Argument(help="What to recall.")],
    user: Annotated[str, typer.Option("--user", help="Whose memories to search.")],
    limit: Annotated[int, typer.Option("--limit", min=1, max=100)] = 5,
    threshold: Annotated[float, typer.Option("--threshold", min=0.0, max=1.0,
                                             help="Relevance threshold t (calibrated relevance, docs/RECALL.md).")] = 0.7,
    as_of: Annotated[str | None, typer.Option("--as-of", help="Recall as of this ISO-8601 moment, e.g. 2026-03-01T00:00:00Z.")] = None,
    explain: Annotated[bool, typer.Option("--explain", help="Say why each hit ranked, in plain words (--json: the whole breakdown).")] = False,
) -> ApiCall:
    """Recall a user's best memories for a query (distillations, and what they said that no
    distillation holds yet), with scores in [0, 1] (nothing when nothing is relevant)."""
    body: dict = {"query": query, "user_id": user, "limit": limit, "threshold": threshold, "explain": explain}
    if as_of is not None:
        body["as_of"] = as_of
    def render(hits: list) -> None:
        if not hits:
            console.print(f"no memory is relevant enough (threshold {threshold:.2f})")
            return
        grid = table("score", "relevance", "kind", "type", "date", "warmth", "id", "content")
        for h in hits:
            marks = " (superseded)" if h.get("superseded_by") else ""
            marks += " (in conflict)" if h.get("in_conflict") else ""
            kind = "your words" if h.get("kind") == "raw" else h["tier"]
            grid.add_row(f"{h['score']:.2f}", f"{h['relevance']:.2f}", kind, type_label(h), str(h["occurred_at"])[:10],
                         f"{h['warmth']:.2f}", h["id"], short(h["content"], 60) + marks)
        console.print(grid)
        if explain:
            for h in hits:
                e = h["explain"]
                console.print(f"{h['id']} (score {h['score']:.2f}, relevance {h['relevance']:.2f}): "
                              + "; ".join(e.get("why") or []), highlight=False, markup=False)

    return ApiCall("POST", "/api/distillations/search", render, json_body=body)
