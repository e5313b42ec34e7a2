"""The vectors of imported exchanges, made in the background once ``yak import`` has returned.

``yak import`` stores a history at the database's speed, recallable by its words at once; the
vectors that make it recallable by meaning take the embedder's time (minutes for thousands of
exchanges on a CPU), so :func:`start` runs this module as a detached process, and the command
returns. It is the same work as ``yak db index`` and the distillation runs do
(``services.exchange_embeddings.embed_pending_exchanges``): rows are claimed ``FOR UPDATE SKIP LOCKED`` a batch
at a time, each batch committed, so it can run beside the pipeline or another import's worker
without doing a row twice, and an interrupted worker leaves the rest to the next one (or to
``yak db index``, or to the distillation runs). ``yak queue status`` shows how many exchanges
still wait; the progress lines go to ``<YAK_HOME>/logs/import-vectors.log``.

Run as ``python -m yak_pipeline.cli.import_vectors USER [USER ...]``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from yak_pipeline.settings import Settings


def log_path(settings: Settings) -> Path:
    """Where the background worker writes its progress and errors."""
    return settings.home / "logs" / "import-vectors.log"


def start(settings: Settings, users: Sequence[str]) -> int:
    """Start the background worker for ``users`` in its own session (it outlives the command); its pid."""
    path = log_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as log:
        process = subprocess.Popen(  # noqa: S603 - this interpreter, this module, user ids already validated
            [sys.executable, "-m", "yak_pipeline.cli.import_vectors", *users],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            # The same home however the worker resolves it (a relative YAK_HOME is the caller's folder).
            env={**os.environ, "YAK_HOME": str(settings.home.resolve())})
    return process.pid


def main(users: Sequence[str]) -> int:
    """Embed the users' exchanges that still lack their vectors; 0 when all are done.

    A process of its own (:func:`start`), not a ``yak`` command: its parts are this process's
    environment's (:func:`yak_pipeline.wiring.process_parts`)."""
    from yak_pipeline.services.exchange_embeddings import embed_pending_exchanges
    from yak_pipeline.wiring import open_database, process_parts

    parts = process_parts()
    settings = parts.settings
    began = time.monotonic()

    def say(line: str) -> None:
        print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} [{os.getpid()}] {line}", flush=True)

    db = open_database(settings)
    try:
        embedder = parts.embedder
        for user_id in users:
            say(f"{user_id}: embedding the exchanges without vectors")

            def progress(count: int, user: str = user_id) -> None:
                say(f"{user}: {count} exchanges embedded")

            done = embed_pending_exchanges(db, embedder, user_id=user_id, on_progress=progress)
            say(f"{user_id}: done, {done} exchanges embedded (and their contexts) in {time.monotonic() - began:.1f} s")
    except Exception as exc:  # noqa: BLE001 - one line in the log; what is done stays, the pipeline does the rest
        say(f"stopped: {' '.join(str(exc).split())[:300] or type(exc).__name__}; `yak db index` or the pipeline "
            "makes the rest")
        return 1
    finally:
        db.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
