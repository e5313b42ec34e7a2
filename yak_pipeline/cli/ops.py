"""Operating Yak through the API: metrics, queue, health, forget, review, conflicts, keys."""

from __future__ import annotations

from typing import Annotated, Literal

import typer

from yak_pipeline.cli.api_client import (
    ApiError,
    ApiKeyOption,
    JsonOption,
    RemoteOption,
    admin_key_file,
    api_client,
    call_api,
    emit,
    parse_id,
)
from yak_pipeline.cli.api_command import ApiCall, api_command
from yak_pipeline.cli.errors import FAILURE_EXIT, USAGE_EXIT, fail, friendly_errors
from yak_pipeline.cli.parts import cli_parts
from yak_pipeline.cli.render import make_console, short, table
from yak_pipeline.core.forget import ForgetCommandError, parse_forget_command
from yak_pipeline.core.wording import plural

console = make_console()
queue_app = typer.Typer(help="The pipeline's queue.", no_args_is_help=True)
review_app = typer.Typer(help="Distillations flagged for a person's decision.", no_args_is_help=True)
conflicts_app = typer.Typer(help="Contradictions between a user's distillations.", no_args_is_help=True)
keys_app = typer.Typer(help="API keys (admin key needed).", no_args_is_help=True)

UserFilter = Annotated[str | None, typer.Option("--user", help="Only this user's (a user key: its own).")]
DistillationId = Annotated[str, typer.Argument(help="Distillation id.")]
ConflictId = Annotated[str, typer.Argument(help="Conflict id.")]
SettledNote = Annotated[str | None, typer.Option("--note", help="How it was settled.")]


def metrics_as_json(text: str) -> dict:
    """Prometheus text as ``{family: {type, help, samples: [{name, labels, value}]}}``."""
    from prometheus_client.parser import text_string_to_metric_families

    return {family.name: {"type": family.type, "help": family.documentation,
                          "samples": [{"name": s.name, "labels": s.labels, "value": s.value} for s in family.samples]}
            for family in text_string_to_metric_families(text)}


def metrics_command(ctx: typer.Context, remote: RemoteOption = None, api_key: ApiKeyOption = None, as_json: JsonOption = False) -> None:
    """Print the Prometheus metrics (raw text; --json parses them)."""
    text = call_api(ctx, remote, api_key, "GET", "/metrics")
    if as_json:
        emit(metrics_as_json(text), True, print)
    else:
        print(text, end="")


def health_command(ctx: typer.Context, remote: RemoteOption = None, api_key: ApiKeyOption = None, as_json: JsonOption = False) -> None:
    """Check that the API reaches its database, embedder and LLM; exit 1 when it does not."""
    with api_client(ctx, remote, api_key) as client:
        try:
            report = client.request("GET", "/health")
        except ApiError as exc:
            if not isinstance(exc.body, dict) or "database" not in exc.body:
                raise
            report = exc.body

    def render(r: dict) -> None:
        grid = table("component", "ok", "detail")
        for name in ("database", "embedder", "llm"):
            grid.add_row(name, "yes" if r[name]["ok"] else "NO", r[name]["detail"])
        console.print(f"status: {r['status']}")
        console.print(grid)

    emit(report, as_json, render)
    if report["status"] != "ok":
        raise typer.Exit(FAILURE_EXIT)


@api_command(queue_app, "status")
def queue_status_command(user: UserFilter = None) -> ApiCall:
    """Show pending memories (awaiting distillation) and turns, the memories still without vectors
    (an import's follow in the background), the latest failed items, and (admin key) what the
    drop folder quarantined in failed/, with the reasons."""

    def render(q: dict) -> None:
        console.print(f"pending: {q['pending_memories']} memories, {q['pending_turns']} turns; "
                      f"failed: {q['failed_memories']} memories, {q['failed_turns']} turns")
        if q.get("unembedded_memories"):
            # An import's vectors follow in the background (`yak import`): recallable by words meanwhile.
            console.print(f"without vectors yet: {q['unembedded_memories']} memories (found by their words "
                          "until then)", highlight=False)
        if q["failed"]:
            grid = table("kind", "id", "user", "status", "attempts", "last error")
            for f in q["failed"]:
                grid.add_row(f["kind"], f["id"], f["user_id"], f["status"], str(f["attempts"]),
                              short(f["last_error"] or "", 60))
            console.print(grid)
        quarantine = q.get("quarantine")
        if quarantine is not None:
            console.print(f"quarantined in {quarantine['folder']}: {quarantine['files']} unreadable files, "
                          f"{quarantine['records']} rejected records", highlight=False)
            if quarantine["items"]:
                grid = table("file", "kind", "records", "reason")
                for item in quarantine["items"]:
                    more = len(item["reasons"]) - 1
                    reason = short(item["reasons"][0] if item["reasons"] else "", 70) + (f" (+{more} more)" if more > 0 else "")
                    grid.add_row(item["name"], item["kind"], str(item["records"] or ""), reason)
                console.print(grid)

    return ApiCall("GET", "/api/queue", render, params={"user_id": user})


def _is_plain_argument(command: str, context_id: str | None) -> bool:
    """True when ``command`` is a bare id or phrase rather than one of the explicit forms."""
    try:
        return parse_forget_command(command, context_id) is None
    except ForgetCommandError:
        return False  # an explicit form with a mistake: the server explains it


def forget_command(
    ctx: typer.Context,
    command: Annotated[str | None, typer.Argument(help="'/forget <id or phrase>', 'delete memory: <id>' or "
                                                       "'forget this memory' (with --context-id).")] = None,
    user: Annotated[str | None, typer.Option("--user", help="Whose memories.")] = None,
    context_id: Annotated[str | None, typer.Option("--context-id", help="The memory in context.")] = None,
    confirm: Annotated[str | None, typer.Option("--confirm", metavar="TOKEN",
                                                help="Delete the candidates of an earlier phrase search.")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Delete phrase candidates without asking.")] = False,
    soft: Annotated[bool, typer.Option("--soft", help="Keep rows, hidden from every read path.")] = False,
    remote: RemoteOption = None, api_key: ApiKeyOption = None, as_json: JsonOption = False,
) -> None:
    """Forget memories: an id deletes at once; a phrase lists the memories containing it and
    deletes them once confirmed (asked here, or --yes, or later with --confirm TOKEN)."""
    if user is None:
        raise fail("--user is required", USAGE_EXIT)
    if (command is None) == (confirm is None):
        raise fail("give a forget command, or --confirm TOKEN", USAGE_EXIT)
    if command is not None and _is_plain_argument(command, context_id):
        # `yak forget <id>` / `yak forget "some phrase"`: the command is implied by the verb.
        command = f"/forget {command}"
    with api_client(ctx, remote, api_key) as client:
        if confirm is not None:
            result = client.request("POST", "/api/forget/confirm",
                                    json_body={"token": confirm, "user_id": user, "soft": soft})
        else:
            result = client.request("POST", "/api/forget", json_body={
                "command": command, "user_id": user, "context_memory_id": context_id, "soft": soft})
            if result["action"] == "confirm":
                if not as_json:
                    grid = table("memory", "occurred", "content")
                    for c in result["candidates"]:
                        grid.add_row(c["memory_id"], c["occurred_at"][:19], short(c["content"], 70))
                    console.print(grid)
                ask = not yes and not as_json
                if yes or (ask and typer.confirm(f"Forget these {len(result['candidates'])} memories?")):
                    result = client.request("POST", "/api/forget/confirm", json_body={
                        "token": result["confirmation_token"], "user_id": user, "soft": soft})

    def render(r: dict) -> None:
        if r["action"] == "deleted":
            console.print(f"forgot {plural(len(r['deleted_memory_ids']), 'memory', 'memories')} and "
                          f"{plural(len(r['deleted_distillation_ids']), 'distillation')}"
                          + (f"; not found: {', '.join(r['not_found'])}" if r["not_found"] else ""))
        elif r["action"] == "nothing":
            console.print("no memory contains that phrase")
        else:
            console.print(f"nothing deleted; confirm later with --confirm {r['confirmation_token']}")

    emit(result, as_json, render)


def _render_review(items: list) -> None:
    grid = table("id", "user", "status", "conf", "tier", "conflict", "content")
    for d in items:
        grid.add_row(d["id"], d["user_id"], d["status"], f"{d['confidence']:.2f}", d["tier"],
                      "yes" if d["in_conflict"] else "", short(d["content"], 60))
    console.print(grid if items else "nothing waits for review")


@api_command(review_app, "list")
def review_list_command(
    user: UserFilter = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=500)] = 50,
) -> ApiCall:
    """List distillations waiting for a decision, oldest first."""
    return ApiCall("GET", "/api/review", _render_review, params={"user_id": user, "limit": limit})


def _review_decision(distillation_id: str, decision: str) -> ApiCall:
    """The request that approves or rejects a flagged distillation."""
    return ApiCall("POST", f"/api/review/{parse_id(distillation_id, 'distillation id')}/{decision}",
                   lambda d: console.print(f"{d['decision']} {d['id']}"))


@api_command(review_app, "approve")
def review_approve_command(distillation_id: DistillationId) -> ApiCall:
    """Approve a flagged distillation: it becomes active and recallable."""
    return _review_decision(distillation_id, "approve")


@api_command(review_app, "reject")
def review_reject_command(distillation_id: DistillationId) -> ApiCall:
    """Reject a flagged distillation: kept, never recalled."""
    return _review_decision(distillation_id, "reject")


@api_command(conflicts_app, "list")
def conflicts_list_command(
    user: UserFilter = None,
    status: Annotated[str, typer.Option("--status", help="open, resolved, dismissed or all.")] = "open",
) -> ApiCall:
    """List conflicts with both sides' text."""

    def render(items: list) -> None:
        grid = table("id", "user", "score", "status", "a", "b")
        for c in items:
            grid.add_row(c["id"], c["user_id"], f"{c['score']:.2f}", c["status"], short(c["content_a"], 40),
                          short(c["content_b"], 40))
        console.print(grid if items else "no conflicts")

    return ApiCall("GET", "/api/conflicts", render, params={"user_id": user, "status": status})


def _close_conflict(action: str, conflict_id: str, body: dict, shown: str = "") -> ApiCall:
    """The request that resolves, dismisses or keeps a side of a conflict."""
    return ApiCall("POST", f"/api/conflicts/{parse_id(conflict_id, 'conflict id')}/{action}",
                   lambda d: console.print(f"conflict {d['id']} {d['status']}{shown}"), json_body=body)


@api_command(conflicts_app, "resolve")
def conflicts_resolve_command(conflict_id: ConflictId, note: SettledNote = None) -> ApiCall:
    """Mark a conflict resolved (after rejecting or editing one side)."""
    return _close_conflict("resolve", conflict_id, {"resolution": note})


@api_command(conflicts_app, "dismiss")
def conflicts_dismiss_command(
    conflict_id: ConflictId,
    note: Annotated[str | None, typer.Option("--note", help="Why it is no contradiction.")] = None,
) -> ApiCall:
    """Mark a conflict as no contradiction after all."""
    return _close_conflict("dismiss", conflict_id, {"resolution": note})


@api_command(conflicts_app, "keep")
def conflicts_keep_command(
    conflict_id: ConflictId,
    side: Annotated[Literal["a", "b", "both"], typer.Argument(help="a or b (the other side is rejected), or both.")],
    note: SettledNote = None,
) -> ApiCall:
    """Settle a conflict by keeping one side (the other is rejected: kept, never recalled) or both."""
    return _close_conflict("keep", conflict_id, {"keep": side, "resolution": note}, f" (kept {side})")


@keys_app.command("create")
@friendly_errors
def keys_create_command(
    ctx: typer.Context,
    user: Annotated[str | None, typer.Option("--user", help="Scope the key to this user id.")] = None,
    admin: Annotated[bool, typer.Option("--admin", help="An admin key (every user).")] = False,
    label: Annotated[str | None, typer.Option("--label", help="A note on what the key is for.")] = None,
    read_only: Annotated[bool, typer.Option("--read-only", help="The key may recall and search, never write or forget.")] = False,
    remote: RemoteOption = None, api_key: ApiKeyOption = None, as_json: JsonOption = False,
) -> None:
    """Create an API key and print it; it is shown this once. ``--read-only``: a key for recall and
    search only (the API, the memory proxy, MCP and the web page refuse its writes and forgets)."""
    if admin == (user is not None):
        raise fail("give either --user USER or --admin", USAGE_EXIT)
    data = call_api(ctx, remote, api_key, "POST", "/api/keys",
                    json_body={"user_id": user, "admin": admin, "label": label, "read_only": read_only})
    if as_json:
        emit(data, True, print)
        return
    print(data["key"])
    kind = 'admin key' if data['admin'] else 'key for user ' + data['user_id']
    make_console(stderr=True).print(f"{'read-only ' if data.get('read_only') else ''}{kind} "
                                    f"{data['prefix']}… created; it is not shown again")


@keys_app.command("show-admin")
@friendly_errors
def keys_show_admin_command(ctx: typer.Context, as_json: JsonOption = False) -> None:
    """Print the admin key `yak serve` (or `yak up`) created on its first start, from the key file
    in $YAK_HOME, e.g. KEY=$(yak keys show-admin); --json also names the file."""
    path = admin_key_file(cli_parts(ctx).client)
    try:
        key = path.read_text().strip()
    except FileNotFoundError:
        raise fail(f"no admin key in {path}: `yak serve` or `yak up` creates it on its first start "
                   "(is YAK_HOME the one they ran with?)", FAILURE_EXIT) from None
    except OSError as exc:
        raise fail(f"cannot read the admin key in {path}: {exc.strerror or exc}", FAILURE_EXIT) from None
    if not key:
        raise fail(f"the admin key file {path} is empty: delete it and start `yak serve` to make a new one",
                   FAILURE_EXIT)
    emit({"key": key, "file": str(path)}, as_json, lambda d: print(d["key"]))


@api_command(keys_app, "list")
def keys_list_command(
    include_revoked: Annotated[bool, typer.Option("--all", help="Include revoked keys.")] = False,
) -> ApiCall:
    """List API keys (their prefixes, never the keys)."""

    def render(keys: list) -> None:
        grid = table("id", "prefix", "scope", "label", "created", "revoked")
        for k in keys:
            grid.add_row(k["id"], k["prefix"] + "…", "admin" if k["admin"] else k["user_id"], k["label"] or "",
                          k["created_at"][:19], (k["revoked_at"] or "")[:19])
        console.print(grid)

    return ApiCall("GET", "/api/keys", render, params={"include_revoked": str(include_revoked).lower()})


@api_command(keys_app, "revoke")
def keys_revoke_command(key_id: Annotated[str, typer.Argument(help="Key id (from `yak keys list`).")]) -> ApiCall:
    """Revoke an API key."""
    return ApiCall("DELETE", f"/api/keys/{parse_id(key_id, 'key id')}",
                   lambda d: console.print(f"revoked key {d['prefix']}…"))


def register(app: typer.Typer) -> None:
    """Add metrics, health, forget, queue, review, conflicts and keys to the ``yak`` app."""
    app.command("metrics")(friendly_errors(metrics_command))
    app.command("health")(friendly_errors(health_command))
    app.command("forget")(friendly_errors(forget_command))
    app.add_typer(queue_app, name="queue")
    app.add_typer(review_app, name="review")
    app.add_typer(conflicts_app, name="conflicts")
    app.add_typer(keys_app, name="keys")

