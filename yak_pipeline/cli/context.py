"""``yak context``: the memory block a prompt would get for a question, as ``/api/context`` builds it."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from yak_pipeline.cli.api_command import ApiCall, api_command


def context_command(
    query: Annotated[str, typer.Argument(help="The prompt's question, as the assistant would send it.")],
    user: Annotated[str, typer.Option("--user", help="Whose memories to recall.")],
    limit: Annotated[int, typer.Option("--limit", min=1, max=100, help="Most memories in the block.")] = 5,
    threshold: Annotated[float, typer.Option("--threshold", min=0.0, max=1.0,
                                             help="Relevance threshold t (calibrated relevance, docs/RECALL.md).")] = 0.7,
    as_of: Annotated[str | None, typer.Option("--as-of", help="Recall as of this ISO-8601 moment, e.g. 2026-03-01T00:00:00Z.")] = None,
) -> ApiCall:
    """Print the exact <memories> block a prompt would get for QUERY (what /api/context puts
    before the user's message); --json gives the block, the recalled ids and the prompt messages."""
    body: dict = {"query": query, "user_id": user, "limit": limit, "threshold": threshold}
    if as_of is not None:
        body["as_of"] = as_of

    def render(answer: dict) -> None:
        # The block byte for byte on stdout (so it can be piped or diffed); why it is empty on stderr.
        if answer["block"]:
            sys.stdout.write(answer["block"] if answer["block"].endswith("\n") else answer["block"] + "\n")
        if answer.get("recall_error"):
            sys.stderr.write(f"note: recall failed ({answer['recall_error']}); the prompt gets no memories\n")
        elif answer.get("note"):
            sys.stderr.write(f"note: {answer['note']}; the block is empty\n")
        elif not answer["block"]:
            sys.stderr.write(f"note: no memory is relevant enough (threshold {threshold:.2f}); the block is empty\n")

    return ApiCall("POST", "/api/context", render, json_body=body)


def register(app: typer.Typer) -> None:
    """Add ``context`` to the ``yak`` app."""
    api_command(app, "context")(context_command)
