"""``yak distill``: list and show distillations, write a version, pin, set the tier or the type,
merge two, re-embed one or all."""

from __future__ import annotations

from typing import Annotated

import typer

from yak_pipeline.cli.api_client import ApiKeyOption, JsonOption, RemoteOption, emit, parse_id
from yak_pipeline.cli.api_command import ApiCall, api_command, call_and_print
from yak_pipeline.cli.errors import friendly_errors
from yak_pipeline.cli.parts import cli_parts
from yak_pipeline.cli.render import make_console, print_page, short, table, type_label
from yak_pipeline.core.wording import weight_note

app = typer.Typer(help="Distillations: list, show, version, pin, tier, type, merge, re-embed.", no_args_is_help=True)
console = make_console()
DistillationId = Annotated[str, typer.Argument(help="Distillation id.")]


def _path(distillation_id: str, action: str = "") -> str:
    """The API path of one distillation (``action`` appended), its id checked."""
    return f"/api/distillations/{parse_id(distillation_id, 'distillation id')}{action}"


def render_distillation(d: dict) -> None:
    """A distillation and its versions, for people."""
    console.print(f"[bold]{d['id']}[/bold] user {d['user_id']}, {d['status']}"
                  f"{' (needs review)' if d['needs_review'] else ''}, tier {d['tier']}, type {type_label(d)}, "
                  f"confidence {d['confidence']:.2f}, warmth {d['warmth']:.2f}")
    console.print(d["content"], markup=False, highlight=False)
    if d.get("superseded_by"):
        console.print(f"superseded by {d['superseded_by']} (a newer memory; this one is kept for the past)")
    grid = table("version", "reason", "created", "content")
    for v in d["versions"]:
        grid.add_row(str(v["version"]), v["reason"], v["created_at"][:19], short(v["content"], 70))
    console.print(grid)


@api_command(app, "list")
def list_command(
    user: Annotated[str | None, typer.Option("--user", help="Only this user's.")] = None,
    status: Annotated[str | None, typer.Option("--status", help="active, review, rejected or merged.")] = None,
    memory: Annotated[str | None, typer.Option("--memory", help="Only those of this memory id.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500)] = 50,
    offset: Annotated[int, typer.Option("--offset", min=0)] = 0,
) -> ApiCall:
    """List distillations, newest first."""
    params = {"user_id": user, "status": status, "limit": limit, "offset": offset,
              "memory_id": parse_id(memory, "memory id") if memory else None}

    def render(page: dict) -> None:
        grid = table("id", "user", "tier", "type", "conf", "warmth", "status", "content")
        for d in page["items"]:
            grid.add_row(d["id"], d["user_id"], d["tier"], type_label(d), f"{d['confidence']:.2f}", f"{d['warmth']:.2f}",
                          d["status"] + ("*" if d["needs_review"] else ""), short(d["content"], 60))
        print_page(console, grid, page)

    return ApiCall("GET", "/api/distillations", render, params=params)


@api_command(app, "show")
def show_command(distillation_id: DistillationId) -> ApiCall:
    """Show a distillation with every version of its text."""
    return ApiCall("GET", _path(distillation_id), render_distillation)


@api_command(app, "version")
def version_command(
    distillation_id: DistillationId,
    content: Annotated[str, typer.Option("--content", help="The new text (1-4 sentences).")],
) -> ApiCall:
    """Write a new version of a distillation's text by hand; the old text stays as a version."""
    return ApiCall("POST", _path(distillation_id, "/versions"), render_distillation, json_body={"content": content})


@api_command(app, "pin")
def pin_command(
    distillation_id: DistillationId,
    weight: Annotated[float, typer.Option("--weight", min=0.01, max=10.0,
                                          help="user_weight, a factor of recall's gravity: 1 unpins.")] = 2.0,
) -> ApiCall:
    """Pin a distillation: give it a user_weight (default 2) so recall ranks it higher; --weight 1 unpins."""
    return ApiCall("POST", _path(distillation_id, "/weight"),
                   lambda d: console.print(f"{d['id']} {weight_note(None, d['user_weight'])}", soft_wrap=True),
                   json_body={"user_weight": weight})


@api_command(app, "tier")
def tier_command(
    distillation_id: DistillationId,
    tier: Annotated[str, typer.Argument(help="core, medium or low.")],
) -> ApiCall:
    """Set a distillation's tier: core weighs twice as much in recall, low half as much."""
    return ApiCall("POST", _path(distillation_id, "/tier"), lambda d: console.print(f"{d['id']} tier {d['tier']}"),
                   json_body={"tier": tier})


@api_command(app, "type")
def type_command(
    distillation_id: DistillationId,
    memory_type: Annotated[str, typer.Argument(metavar="TYPE", help="instruction, preference, fact or event.")],
) -> ApiCall:
    """Set a distillation's type: instruction, preference, fact or event (an event is dated from what
    the user said). MEMORY.md groups memories by it; recall's ranking does not use it."""
    return ApiCall("POST", _path(distillation_id, "/type"),
                   lambda d: console.print(f"{d['id']} type {type_label(d)}"), json_body={"memory_type": memory_type})


@api_command(app, "merge")
def merge_command(
    keep_id: Annotated[str, typer.Argument(help="The distillation that stays (gets a new version).")],
    merge_id: Annotated[str, typer.Argument(help="The distillation merged into it (becomes 'merged').")],
    content: Annotated[str | None, typer.Option("--content", help="The merged text; default: the LLM writes it.")] = None,
) -> ApiCall:
    """Merge two of a user's distillations into one."""
    body = {"keep_id": parse_id(keep_id, "keep id"), "merge_id": parse_id(merge_id, "merge id"), "content": content}
    return ApiCall("POST", "/api/distillations/merge", render_distillation, json_body=body)


@app.command("re-embed")
@friendly_errors
def reembed_command(
    ctx: typer.Context,
    distillation_id: Annotated[str | None, typer.Argument(help="Distillation id (or --all).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Carry the whole database over to the configured "
                                       "embedder: every distillation, exchange and context, with progress.")] = False,
    remote: RemoteOption = None, api_key: ApiKeyOption = None, as_json: JsonOption = False,
) -> None:
    """Embed a distillation's text again with the active embedding model, or with ``--all`` every vector.

    ``--all`` is what switching ``YAK_EMBEDDER`` needs: recall compares only vectors of the active
    model, so until then memories are found by their words alone. It runs here, on the configured
    database (not through a server), resizes the vector columns when the new model's size
    differs, and can be interrupted: what is done is kept, and a second run goes on from there.
    """
    if all_ == (distillation_id is not None):
        raise typer.BadParameter("give a distillation id or --all (not both)")
    if distillation_id is not None:
        call = ApiCall("POST", _path(distillation_id, "/re-embed"),
                       lambda d: console.print(f"re-embedded {d['id']} with {d['embedding_model']}"))
        call_and_print(ctx, call, remote=remote, api_key=api_key, as_json=as_json)
        return
    if remote:
        raise typer.BadParameter("--all runs on the configured database, not through --remote")
    from yak_pipeline.recall_models import RelevanceModelMissing, load_relevance_model
    from yak_pipeline.services.reembed import reembed_database, resize_for_embedder
    from yak_pipeline.store.database import resolve_database_url
    from yak_pipeline.wiring import open_database

    parts = cli_parts(ctx).parts
    settings, embedder = parts.settings, parts.embedder
    progress = make_console(stderr=True)
    url = resolve_database_url(settings)
    resized = resize_for_embedder(url, embedder)
    if resized:
        progress.print(f"vector columns resized to {embedder.dimensions} dimensions: {', '.join(resized)}")
    db = open_database(settings, url=url)
    try:
        report = reembed_database(db, embedder, resized=resized,
                                  on_progress=lambda kind, n: progress.print(f"embedded {n} {kind} …"))
    finally:
        db.close()
    try:
        load_relevance_model(embedder.model_name, home=settings.home)
        calibrated = True
    except RelevanceModelMissing:
        calibrated = False
    data = {"embedding_model": report.embedding_model, "resized": report.resized,
            "distillations": report.distillations, "exchanges": report.exchanges, "contexts": report.contexts,
            "relevance_model": calibrated}

    def render(d: dict) -> None:
        console.print(f"re-embedded {d['distillations']} distillations, {d['exchanges']} exchanges and "
                      f"{d['contexts']} exchange contexts with {d['embedding_model']}")
        if not d["relevance_model"]:
            console.print(f"no relevance model is fitted for {d['embedding_model']}: recall answers once "
                          "`yak eval calibrate --data FILE` has made one (docs/RECALL.md)")

    emit(data, as_json, render)
