"""A scratch database for one evaluation run: made new on the configured server, dropped after.

An evaluation never touches the user's data: each data file gets its own ``yak_eval_<random>``
database, migrated for the configured embedder, dropped at the end (also on Ctrl-C or an error)
unless asked to keep it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from yak_pipeline.eval.options import Progress, quiet
from yak_pipeline.settings import Settings
from yak_pipeline.store.database import Database, create_database, drop_database, resolve_database_url, with_database
from yak_pipeline.store.errors import StoreError


class EvalError(StoreError):
    """The evaluation cannot run (its database cannot be made, say); one line saying why."""


@contextmanager
def evaluation_database(settings: Settings, *, keep: bool = False, progress: Progress = quiet) -> Iterator[Database]:
    """A new, migrated database on the configured server for this evaluation alone; dropped after."""
    from yak_pipeline.wiring import open_database

    server_url = resolve_database_url(settings)
    name = f"yak_eval_{uuid.uuid4().hex[:12]}"
    try:
        create_database(server_url, name)
    except StoreError:
        raise  # already one line (server unreachable, say)
    except psycopg.Error as exc:  # a permission or server problem, said in one line
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise EvalError(f"cannot create the evaluation database: {reason} "
                        "(the database user needs CREATEDB)") from None
    db: Database | None = None
    try:
        db = open_database(settings, url=with_database(server_url, name), max_size=max(4, settings.llm_concurrency + 2))
        progress(f"evaluation database {name} created")
        yield db
    finally:
        if db is not None:
            db.close()
        if keep:
            progress(f"kept evaluation database {name}")
        else:
            drop_database(server_url, name)
