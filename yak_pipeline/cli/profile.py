"""``yak profile``: the standing instructions and preferences every memory block carries."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from yak_pipeline.cli.api_client import JsonOption, parse_id
from yak_pipeline.cli.api_command import ApiCall, api_command
from yak_pipeline.cli.errors import friendly_errors
from yak_pipeline.cli.parts import cli_parts
from yak_pipeline.cli.render import make_console, short, table
from yak_pipeline.core.wording import plural

app = typer.Typer(help="The profile: standing instructions and preferences, sent with every prompt.",
                  no_args_is_help=True)
console = make_console()


@api_command(app, "show")
def show_command(
    user: Annotated[str, typer.Option("--user", help="Whose profile.")],
) -> ApiCall:
    """Show exactly what every memory block of USER carries (instructions first, newest first, within
    YAK_PROFILE_TOKENS), then the lines it does not carry and why; --json for the whole answer."""

    def render(answer: dict) -> None:
        sent = {line["id"] for line in answer["sent"]}
        if not answer["lines"]:
            console.print(f"{user} has no profile yet: say \"Always …\" or \"I prefer …\" and it starts")
            return
        grid = table("id", "kind", "said", "line", "sent")
        for line in answer["sent"] + [line for line in answer["lines"] if line["id"] not in sent]:
            grid.add_row(line["id"], line["kind"], line["said_at"][:10], short(line["text"], 90),
                         "yes" if line["id"] in sent else f"no: {line.get('why_not_sent') or ''}")
        console.print(grid)
        console.print(f"every block carries {plural(len(answer['sent']), 'line')} "
                      f"(budget {answer['token_budget']} tokens); drop one with `yak profile drop ID --user {user}`")

    return ApiCall("GET", "/api/profile", render, params={"user_id": user})


@api_command(app, "drop")
def drop_command(
    ids: Annotated[list[str], typer.Argument(help="Profile line ids (from `yak profile show`).")],
    user: Annotated[str, typer.Option("--user", help="Whose profile.")],
    keep: Annotated[bool, typer.Option("--keep", help="Put the lines back into the profile instead.")] = False,
) -> ApiCall:
    """Take lines out of USER's profile (the exchanges stay memories; `yak memory delete` forgets one)."""
    body = {"user_id": user, "ids": [parse_id(i) for i in ids], "keep": keep}
    verb = "put back" if keep else "dropped"
    return ApiCall("POST", "/api/profile/drop",
                   lambda d: console.print(f"{verb} {plural(len(d['changed']), 'profile line')}"), json_body=body)


@app.command("rebuild")
@friendly_errors
def rebuild_command(
    ctx: typer.Context,
    user: Annotated[str | None, typer.Option("--user", help="Only this user's exchanges.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Read every stored exchange again for its instructions and preferences (after an upgrade that
    changes how they are found); lines the user dropped stay dropped. Works on the database directly."""
    from yak_pipeline.services.profile import rebuild_profile
    from yak_pipeline.wiring import open_database

    db = open_database(cli_parts(ctx).settings)
    try:
        found = rebuild_profile(db, user_id=user)
    finally:
        db.close()
    if as_json:
        print(json.dumps({"exchanges_with_profile_lines": found}))
        return
    console.print(f"{plural(found, 'exchange')} state an instruction or a preference")
