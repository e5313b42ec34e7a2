"""``yak import``, ``yak export`` and ``yak restore``: history in, memory out, and whole-memory backups.

Local admin commands, like ``yak process``: they read and write files on this machine and work
on the configured database directly (whoever can run them holds its credentials already).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from yak_pipeline.cli.errors import FAILURE_EXIT, USAGE_EXIT, fail, friendly_errors
from yak_pipeline.cli.parts import cli_parts
from yak_pipeline.cli.render import make_console, table
from yak_pipeline.core.types import validate_user_id

if TYPE_CHECKING:  # imported when a bar is drawn: every `yak` command imports this module
    from rich.progress import Progress, TaskID

console = make_console()
err_console = make_console(stderr=True)
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of a table.")]


class ExportFormat(StrEnum):
    """What ``yak export`` writes."""

    md = "md"
    jsonl = "jsonl"


def _progress(enabled: bool) -> Progress:
    """A progress bar on stderr (nothing when ``enabled`` is false: ``--json``, or not a terminal)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err_console, disable=not enabled or not err_console.is_terminal, transient=True)


def import_command(
    ctx: typer.Context,
    files: Annotated[list[Path], typer.Argument(
        help="History files: a ChatGPT or Claude.ai data export (conversations.json or the export's .zip), "
             "Claude Code session transcripts (.jsonl), or Yak drop files (.jsonl, .json, .md).")],
    user: Annotated[str | None, typer.Option(
        "--user", help="Whose history it is: needed for exports, which name no user; Yak records without "
                       "user_id get it too, and records naming another user are quarantined.")] = None,
    wait: Annotated[bool, typer.Option(
        "--wait", help="Make the imported exchanges' vectors before returning, with a progress bar, instead "
                       "of in the background.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Import chat history: each exchange of each file becomes a pending memory of the user.

    The format is told from the content. Importing a file again adds nothing; a Claude Code
    session that grew is read from where the last import stopped, and an exchange stored while
    still being answered is updated in place, never stored twice. Bad records are quarantined
    once in the drop folder's failed/ with their reasons (`yak queue status` lists them), the rest
    imported. A damaged file (cut mid-line) has what was whole imported and exits 1 saying so.
    What is imported is recallable by its words when the command returns; the vectors that make
    it recallable by meaning follow in the background (`yak queue status` shows how many wait;
    --wait makes them first). Run `yak process` (or let `yak up` run) to distil what was imported.
    """
    from yak_pipeline.ingestion.history import import_history, quarantine_import
    from yak_pipeline.wiring import open_database

    if user is not None:
        validate_user_id(user)
    parts = cli_parts(ctx).parts
    settings = parts.settings
    db = open_database(settings)
    results = []
    try:
        with _progress(not as_json) as bars:
            for path in files:
                try:
                    data = path.read_bytes()
                except OSError as exc:
                    results.append({"file": str(path), "format": None, "error": f"cannot read it: {exc.strerror or exc}"})
                    continue
                task = bars.add_task(f"storing {path.name}", total=None)
                outcome = import_history(
                    db, path.name, data, user_id=user, source="import", source_ref=path.name,
                    on_progress=functools.partial(_show_progress, bars, task))
                bars.remove_task(task)
                quarantine_import(outcome, settings.resolved_drop_dir)
                results.append(outcome.summary() | {"file": str(path)})
            totals = _import_totals(results)
            if totals["exchanges"] or totals["updated"]:
                # Recallable by their words already; their vectors make them recallable by meaning
                # before distillation has run. The embedder takes minutes where storing took seconds,
                # so they are made in the background unless asked for now (batches commit either way).
                if wait:
                    totals["embedded"] = _embed_imported(db, parts.embedder, totals["users"], bars)
                else:
                    from yak_pipeline.cli import import_vectors

                    totals["vectors"] = {"background_pid": import_vectors.start(settings, totals["users"]),
                                         "log": str(import_vectors.log_path(settings).resolve())}
    finally:
        db.close()
    report = {"files": results, "totals": totals}
    if as_json:
        print(json.dumps(report))
    else:
        _print_import(report)
    # A damaged file (cut mid-line or mid-conversation) had what was whole stored, but is not all there.
    if any(r.get("error") or r.get("damaged") for r in results):
        raise typer.Exit(FAILURE_EXIT)


def _show_progress(bars: Progress, task: TaskID, done: int, total: int | None) -> None:
    """One file's storing progress on its bar."""
    bars.update(task, completed=done, total=total)


def _show_embedded(bars: Progress, task: TaskID, before: int, count: int) -> None:
    """The embedding bar: ``before`` exchanges of earlier users, ``count`` of this one."""
    bars.update(task, completed=before + count)


def _embed_imported(db, embedder, users: list[str], bars: Progress) -> int:  # noqa: ANN001 - Database, Embedder
    """Embed the imported users' exchanges that have no vector yet, with a progress bar; how many."""
    from yak_pipeline.services.exchange_embeddings import embed_pending_exchanges

    task = bars.add_task("embedding for recall", total=None)
    done = 0
    for user_id in users:
        done += embed_pending_exchanges(
            db, embedder, user_id=user_id,
            on_progress=functools.partial(_show_embedded, bars, task, done))
    bars.remove_task(task)
    return done


def _import_totals(results: list[dict]) -> dict:
    good = [r for r in results if not r.get("error")]
    firsts = [r["first"] for r in good if r.get("first")]
    lasts = [r["last"] for r in good if r.get("last")]
    return {"exchanges": sum(r["stored"] for r in good), "already_stored": sum(r["duplicates"] for r in good),
            "updated": sum(r["updated"] for r in good),
            "already_quarantined": sum(r["already_quarantined"] for r in good),
            "skipped": sum(r["skipped"] for r in good), "quarantined": sum(r["quarantined"] for r in good),
            "failed_files": sum(1 for r in results if r.get("error")),
            "users": sorted({u for r in good for u in r["users"]}),
            "first": min(firsts) if firsts else None, "last": max(lasts) if lasts else None}


def _print_import(report: dict) -> None:
    grid = table("file", "format", "new", "already there", "skipped", "quarantined")
    for r in report["files"]:
        if r.get("error"):
            print(f"error: {r['file']}: {r['error']}", file=sys.stderr)
            continue
        if r.get("damaged"):
            print(f"error: {r['file']} is damaged: {r['damaged']}", file=sys.stderr)
        grid.add_row(r["file"], r["format"], str(r["stored"]), str(r["duplicates"]), str(r["skipped"]),
                     str(r["quarantined"]))
    totals = report["totals"]
    if len(report["files"]) == totals["failed_files"]:
        return
    console.print(grid)
    span = f", {totals['first'][:10]} to {totals['last'][:10]}" if totals["first"] else ""
    grown = f", {totals['updated']} grown since and updated" if totals["updated"] else ""
    console.print(f"{totals['exchanges']} exchanges imported ({totals['already_stored']} already there{grown}), "
                  f"{totals['skipped']} turns skipped, {totals['quarantined']} records quarantined; users: "
                  f"{', '.join(totals['users']) or '-'}{span}", highlight=False)
    for r in report["files"]:
        if r.get("quarantined_to"):
            console.print(f"quarantined: {r['quarantined_to']} (reasons beside it)", highlight=False)
    if totals["exchanges"]:
        console.print("recallable now as your own words; `yak process` distils them (a running `yak up` does it "
                      "by itself)")
    if totals.get("vectors"):
        console.print(f"their vectors (recall by meaning) are being made in the background: `yak queue status` "
                      f"shows how many wait (log: {totals['vectors']['log']})", highlight=False)


def export_command(
    ctx: typer.Context,
    user: Annotated[str | None, typer.Option("--user", help="Whose memory to export.")] = None,
    all_users: Annotated[bool, typer.Option("--all-users", help="Every user (jsonl only).")] = False,
    fmt: Annotated[ExportFormat, typer.Option(
        "--format", help="md: the user's MEMORY.md; jsonl: a backup of everything, for `yak restore`.")] = ExportFormat.md,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to this file (default: stdout).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Export a user's memory: their MEMORY.md (current knowledge by tier, dated, in a stable order),
    or a JSONL backup of one user or all (exchanges, distillations with versions, conflicts, turns,
    warmth events, API keys' metadata; never a key or its hash)."""
    from yak_pipeline.wiring import open_database

    if user is not None:
        validate_user_id(user)
    if fmt is ExportFormat.md and (user is None or all_users):
        raise fail("--format md exports one user's MEMORY.md: give --user U", USAGE_EXIT)
    if fmt is ExportFormat.jsonl and (user is None) == (not all_users):
        raise fail("give --user U or --all-users", USAGE_EXIT)
    if fmt is ExportFormat.jsonl and as_json and output is None:
        raise fail("with --json the summary goes to stdout: give --output FILE for the backup", USAGE_EXIT)
    db = open_database(cli_parts(ctx).settings)
    try:
        if fmt is ExportFormat.md:
            assert user is not None  # checked above: md exports one named user
            _export_markdown(db, user, output, as_json)
        else:
            _export_backup(db, user, output, as_json)
    finally:
        db.close()


def _export_markdown(db, user: str, output: Path | None, as_json: bool) -> None:  # noqa: ANN001 - Database imported lazily
    from yak_pipeline.services.memory_export import UnknownUser, memory_markdown

    try:
        text, count = memory_markdown(db, user)
    except UnknownUser as exc:
        raise fail(str(exc), FAILURE_EXIT) from None
    if output is not None:
        with _atomic_file(output) as handle:
            handle.write(text)
    if as_json:
        print(json.dumps({"user_id": user, "memories": count, "output": str(output) if output else None}
                         | ({} if output else {"markdown": text})))
    elif output is None:
        sys.stdout.write(text)
    else:
        console.print(f"wrote {output}: {count} memories of {user}", highlight=False)


def _export_backup(db, user: str | None, output: Path | None, as_json: bool) -> None:  # noqa: ANN001
    from yak_pipeline.services.backup import write_backup

    with _progress(not as_json) as bars:
        task = bars.add_task("export", total=None)
        progress = lambda done, total: bars.update(task, completed=done, total=max(total, done))  # noqa: E731
        if output is None:
            summary = write_backup(db, sys.stdout, user_id=user, on_progress=progress)
        else:
            with _atomic_file(output) as handle:
                summary = write_backup(db, handle, user_id=user, on_progress=progress)
    if as_json:
        print(json.dumps(summary.as_dict() | {"output": str(output)}))
    elif output is not None:
        rows = ", ".join(f"{n} {t}" for t, n in summary.counts.items())
        console.print(f"wrote {output}: {rows}; users: {', '.join(summary.users) or '-'}", highlight=False)


@contextlib.contextmanager
def _atomic_file(path: Path) -> Iterator:
    """A file written under a temporary name and renamed into place: never half-written."""
    directory = path.resolve().parent
    if not directory.is_dir():
        raise fail(f"cannot write {path}: the folder {directory} does not exist", USAGE_EXIT)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=directory)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            yield handle
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def restore_command(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="A backup written by `yak export --format jsonl`.")],
    as_json: JsonOption = False,
) -> None:
    """Restore a backup into this database, all or nothing. It refuses (one line, nothing written) a
    file that is not a whole Yak backup, and a database that already holds any of its ids or exchanges."""
    from yak_pipeline.services.backup import RestoreRefused, restore_backup
    from yak_pipeline.wiring import open_database

    if not file.is_file():
        raise fail(f"{file} is not a file", USAGE_EXIT)

    def lines() -> Iterator[str]:
        with file.open(encoding="utf-8", errors="strict") as handle:
            yield from handle

    db = open_database(cli_parts(ctx).settings)
    try:
        with _progress(not as_json) as bars:
            task = bars.add_task("restore", total=None)
            summary = restore_backup(db, lines, name=file.name,
                                     on_progress=lambda done, total: bars.update(task, completed=done, total=total))
    except RestoreRefused as exc:
        raise fail(str(exc), FAILURE_EXIT) from None
    except UnicodeDecodeError:
        raise fail(f"{file.name} is not UTF-8 text: not a Yak backup", FAILURE_EXIT) from None
    finally:
        db.close()
    if as_json:
        print(json.dumps(summary.as_dict()))
        return
    rows = ", ".join(f"{n} {t}" for t, n in summary.counts.items() if t != "api_keys")
    console.print(f"restored {rows}; users: {', '.join(summary.users) or '-'}", highlight=False)
    if summary.keys_not_restored:
        console.print(f"{summary.keys_not_restored} API keys are listed in the backup but not restored (a backup "
                      "never holds a key): make new ones with `yak keys create`", highlight=False)
    if summary.embedding_note:
        console.print(summary.embedding_note, highlight=False)


def register(app: typer.Typer) -> None:
    """Add ``import``, ``export`` and ``restore`` to the ``yak`` app."""
    app.command("import")(friendly_errors(import_command))
    app.command("export")(friendly_errors(export_command))
    app.command("restore")(friendly_errors(restore_command))
