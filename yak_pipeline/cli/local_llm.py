"""``--local-llm`` for ``yak up`` and ``yak eval locomo``: run the packaged local model for the command."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console

from yak_pipeline.cli.errors import USAGE_EXIT, fail
from yak_pipeline.llm.local_server import LocalLLM, LocalModelError, start_local_llm
from yak_pipeline.settings import Settings


@contextmanager
def local_llm_running(settings: Settings, console: Console) -> Iterator[tuple[Settings, LocalLLM]]:
    """Start the local model's server; yield ``settings`` pointed at it and the server; stop it after.

    A model or server that cannot be started is a one-line error (exit code 2), not a traceback.
    """
    log_path = settings.home / "logs" / "local-llm.log"
    console.print(f"starting the local model (log: {log_path}) …", highlight=False)
    try:
        server = start_local_llm(log_path)
    except LocalModelError as exc:
        raise fail(exc.reason, USAGE_EXIT) from None
    if settings.llm_base_url:
        console.print("--local-llm: the local model stands in for YAK_LLM_BASE_URL in this run", highlight=False)
    try:
        yield settings.model_copy(update={"llm_base_url": server.base_url, "llm_model": server.model}), server
    finally:
        server.stop()
