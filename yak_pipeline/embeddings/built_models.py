"""Model files built once per machine from a packaged model and kept in the user's cache folder.

The query model (``embeddings.query_model``, int8) and the document model
(``embeddings.document_model``, float32) are both made from packaged files the first time they
are needed (``make setup`` makes them ahead), named for what they were built from, and loaded
from the cache after. Neither is needed for a correct vector, only for a fast one: when one
cannot be built or loaded, a warning says why and its caller runs the packaged model instead.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnxruntime

logger = logging.getLogger("yak.embeddings")


def cache_dir() -> Path:
    """Where built model files are kept: ``$YAK_MODEL_CACHE``, else ``$XDG_CACHE_HOME/yak``, else ``~/.cache/yak``."""
    configured = os.environ.get("YAK_MODEL_CACHE")
    if configured:
        return Path(configured).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "yak"


def built_session(target: Callable[[], Path], build: Callable[[Path], Path], options: onnxruntime.SessionOptions,
                  *, name: str, otherwise: str) -> onnxruntime.InferenceSession | None:
    """An ONNX Runtime session of the file at ``target()``, built there by ``build`` if this machine
    has none yet; None when it cannot be built or loaded, with a one-line warning naming ``name``
    and what happens ``otherwise``. A built file that does not load is removed, to be built again."""
    import onnxruntime

    path = None
    try:
        path = target()
        if not path.is_file():
            logger.info("building the %s once for this machine: %s", name, path)
            build(path)
        return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - any failure here costs speed, never a vector
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        logger.warning("the %s is unavailable (%s); %s", name, reason, otherwise)
        if path is not None and path.is_file():
            with contextlib.suppress(OSError):
                path.unlink()
        return None
