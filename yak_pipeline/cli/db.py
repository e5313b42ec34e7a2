"""``yak db``: which database is in use, migrations, status, and the embedded server."""

from __future__ import annotations

import json

import typer

from yak_pipeline.cli.errors import USAGE_EXIT, fail, friendly_errors
from yak_pipeline.cli.parts import cli_parts
from yak_pipeline.cli.render import make_console

# The store (psycopg, the migrations) and rich's tables are imported inside each command: every
# `yak` command imports this module, and the ones that talk to the API need none of it
# (bench/cli_latency.py).

app = typer.Typer(help="Database: URL, migrations, status, embedded server.", no_args_is_help=True)
console = make_console()

JsonOption = typer.Option(False, "--json", help="Print JSON for scripts instead of a table.")


@app.command("url")
@friendly_errors
def url_command(
    ctx: typer.Context,
    show_password: bool = typer.Option(False, "--show-password", help="Print the password instead of ***."),
    dagster: bool = typer.Option(False, "--dagster", help="Print the URL of Dagster's storage (YAK_DAGSTER_PG_URL)."),
) -> None:
    """Print the database URL in use (starting the embedded server if it is the one in use)."""
    from yak_pipeline.store.database import dagster_storage_url, redact_url, resolve_database_url

    url = resolve_database_url(cli_parts(ctx).settings)
    if dagster:
        url = dagster_storage_url(url)
    print(url if show_password else redact_url(url))


@app.command("migrate")
@friendly_errors
def migrate_command(ctx: typer.Context, as_json: bool = JsonOption) -> None:
    """Apply pending ``sql/`` migrations in order; running it again applies nothing."""
    from yak_pipeline.wiring import migrate_database

    applied = migrate_database(cli_parts(ctx).settings)
    if as_json:
        print(json.dumps({"applied": applied}))
    elif applied:
        for name in applied:
            console.print(f"applied {name}")
    else:
        console.print("database is up to date")


@app.command("status")
@friendly_errors
def status_command(ctx: typer.Context, as_json: bool = JsonOption) -> None:
    """Show applied and pending migrations, the embedding the database holds, and row counts."""
    from rich.table import Table

    from yak_pipeline.store.database import connect, redact_url, resolve_database_url
    from yak_pipeline.store.migrations import migration_states, read_meta, server_versions, table_counts

    settings = cli_parts(ctx).settings
    url = resolve_database_url(settings)
    with connect(url, vector=False) as conn:
        states = migration_states(conn)
        meta = read_meta(conn)
        counts = table_counts(conn)
        server = server_versions(conn)
    report = {
        "database": redact_url(url),
        "embedded": settings.database_url is None,
        "postgresql": server["postgresql"],
        "pgvector": server["pgvector"],
        "migrations": [
            {"name": s.migration.name, "applied_at": s.applied_at.isoformat() if s.applied_at else None}
            for s in states
        ],
        "embedding": {"dimensions": meta.get("embedding_dim"), "model": meta.get("embedding_model")},
        "tables": counts,
    }
    if as_json:
        print(json.dumps(report))
        return
    console.print(f"database: {report['database']}" + (" (embedded)" if report["embedded"] else ""))
    console.print(f"server: PostgreSQL {server['postgresql']}, pgvector {server['pgvector'] or 'not installed'}")
    console.print(f"embedding: {meta.get('embedding_model', '-')} ({meta.get('embedding_dim', '-')} dimensions)")
    migrations = Table("migration", "applied")
    for s in states:
        migrations.add_row(s.migration.name, s.applied_at.isoformat(timespec="seconds") if s.applied_at else "pending")
    console.print(migrations)
    tables = Table("table", "rows")
    for table, count in counts.items():
        tables.add_row(table, "not created" if count is None else str(count))
    console.print(tables)


@app.command("index")
@friendly_errors
def index_command(
    ctx: typer.Context,
    rebuild_context: bool = typer.Option(False, "--rebuild-context",
                                         help="Also recompute every exchange's conversation context for hybrid recall."),
    as_json: bool = JsonOption,
) -> None:
    """Give every exchange the vectors recall reads that it still lacks, and heavy users their own indexes.

    The vectors of each exchange, alone and read with its neighbours (sql/008), are normally
    made by the pipeline's distillation runs; after an upgrade the existing history has none of
    the new kind, and this embeds that backlog with progress (interrupt it at any time: what is
    done is kept). With ``--rebuild-context``, also recompute the conversation context recall
    searches each exchange with; writes keep it up to date, so this is a repair, not routine.
    Last, as the nightly recall_index_job does, BM25's statistics are folded (sql/014) and every
    user with many memories gets their own HNSW indexes (store.user_indexes).
    """
    from yak_pipeline.services.exchange_embeddings import embed_pending_contexts, embed_pending_exchanges
    from yak_pipeline.services.memories import rebuild_exchange_context
    from yak_pipeline.services.recall_indexes import describe_build, maintain_recall_indexes
    from yak_pipeline.wiring import open_database

    parts = cli_parts(ctx).parts
    db = open_database(parts.settings)
    contexts = None
    progress = make_console(stderr=True)
    try:
        if rebuild_context:
            contexts = rebuild_exchange_context(db)
        embedder = parts.embedder
        exchanges = embed_pending_exchanges(db, embedder, contexts=False,
                                            on_progress=lambda n: progress.print(f"embedded {n} exchanges …"))
        in_context = embed_pending_contexts(
            db, embedder, on_progress=lambda n: progress.print(f"embedded {n} exchanges in their context …"))
        indexes = maintain_recall_indexes(db, on_build=lambda *build: progress.print(f"{describe_build(*build)} …"))
    finally:
        db.close()
    if as_json:
        print(json.dumps({"contexts_rebuilt": contexts, "exchanges_embedded": exchanges,
                          "contexts_embedded": in_context, "recall_indexes_built": indexes}))
        return
    if contexts is not None:
        console.print(f"rebuilt the conversation context of {contexts} exchanges")
    console.print(f"embedded {exchanges} exchanges and {in_context} exchange contexts; "
                  f"built {len(indexes)} per-user recall indexes")


@app.command("scan-secrets")
@friendly_errors
def scan_secrets_command(
    ctx: typer.Context,
    dry_run: bool = typer.Option(False, "--dry-run", help="Only count the secrets found; change nothing."),
    as_json: bool = JsonOption,
) -> None:
    """Find secrets already stored (API keys, tokens, private keys, passwords, cards, IBANs) and redact them.

    Every column that holds what people said is read (exchanges, turns, distillations and their
    versions, errors, conflict resolutions); each secret becomes a typed placeholder such as
    ``[secret: api key]``, as new writes get (``YAK_SECRETS``), and the changed rows' vectors are
    made again from the redacted text. Progress goes to stderr; interrupting keeps what is done,
    and running it again finds the rest. The audit log records each redaction by kind, never
    the secret.
    """
    from yak_pipeline.services.secret_scan import scan_secrets
    from yak_pipeline.wiring import open_database

    parts = cli_parts(ctx).parts
    db = open_database(parts.settings)
    progress = make_console(stderr=True)
    try:
        report = scan_secrets(db, None if dry_run else parts.embedder, dry_run=dry_run,
                              on_progress=lambda name, read, total: progress.print(f"{name}: {read}/{total} rows read …"))
    finally:
        db.close()
    if as_json:
        print(json.dumps(report.as_dict()))
        return
    found = sum(report.secrets.values())
    kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(report.secrets.items())) or "none"
    rows = sum(report.rows_with_secrets.values())
    verb = "would redact" if dry_run else "redacted"
    console.print(f"read {sum(report.rows_read.values())} texts: {verb} {found} secrets ({kinds}) in {rows} rows"
                  + ("" if dry_run else f"; {report.exchanges_reembedded} exchanges embedded again"))


@app.command("upgrade")
@friendly_errors
def upgrade_command(ctx: typer.Context, as_json: bool = JsonOption) -> None:
    """Carry an earlier Yak's embedded PostgreSQL 16 data over to PostgreSQL 18, every row checked.

    Every database in ``$YAK_HOME/pgdata`` is dumped and restored into a new directory and each
    table's row count compared before the new directory takes the old one's place; the old one
    is kept beside it (``pgdata.pg16-…``) until you delete it. Stop ``yak up`` / ``yak serve``
    first: the old server is stopped for the copy.
    """
    from rich.table import Table

    from yak_pipeline.store.embedded_upgrade import upgrade_embedded_data

    settings = cli_parts(ctx).settings
    if settings.database_url:
        raise fail("YAK_DATABASE_URL is set: Yak does not manage that server; upgrade it with pg_upgrade "
                   "or pg_dump / pg_restore", USAGE_EXIT)
    progress = make_console(stderr=True)
    report = upgrade_embedded_data(settings.pgdata_dir, on_progress=lambda line: progress.print(line))
    if as_json:
        print(json.dumps(report.as_dict()))
        return
    table = Table("database", "tables", "rows")
    for db in report.databases:
        table.add_row(db.name, str(len(db.rows)), str(db.total_rows))
    console.print(table)
    console.print(f"upgraded {report.pgdata} from PostgreSQL {report.old_major} to {report.new_major} "
                  f"in {report.seconds:.1f} s; the old data is in {report.kept_old_at} (delete it when satisfied)")


@app.command("stop")
@friendly_errors
def stop_command(ctx: typer.Context, as_json: bool = JsonOption) -> None:
    """Stop the embedded PostgreSQL server (nothing to do with an external YAK_DATABASE_URL)."""
    from yak_pipeline.store.embedded import stop_embedded_server

    settings = cli_parts(ctx).settings
    if settings.database_url:
        message, stopped = "YAK_DATABASE_URL is set: Yak does not manage that server", False
    else:
        stopped = stop_embedded_server(settings.pgdata_dir)
        message = "embedded server stopped" if stopped else "embedded server was not running"
    if as_json:
        print(json.dumps({"stopped": stopped, "message": message}))
    else:
        console.print(message)


@app.command("running")
@friendly_errors
def running_command(ctx: typer.Context) -> None:
    """Exit 0 if the embedded server is running, 1 if not (for scripts)."""
    from yak_pipeline.store.embedded import embedded_server_running

    raise typer.Exit(0 if embedded_server_running(cli_parts(ctx).settings.pgdata_dir) else 1)
