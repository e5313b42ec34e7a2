"""Fitted relevance models (``core.relevance.RelevanceModel``), one JSON file per embedding model.

The files here ship with Yak, fitted by ``yak eval calibrate`` on the dev data (docs/RECALL.md).
A model fitted by a user for another embedder goes to ``$YAK_HOME/recall_models/`` and takes
precedence. An embedder with no fitted model is a one-line error naming the command that fits
one: recall never guesses what a cosine of an unknown embedder means.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

from yak_pipeline.core.relevance import RelevanceModel

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class RelevanceModelMissing(RuntimeError):
    """No relevance model is fitted for the configured embedder; the message says how to fit one."""


def model_file_name(embedding_model: str) -> str:
    """The file a relevance model for ``embedding_model`` is stored in."""
    return _UNSAFE.sub("_", embedding_model).strip("_") + ".json"


def user_models_dir(home: Path) -> Path:
    """Where ``yak eval calibrate`` writes models fitted by the user (``$YAK_HOME/recall_models``)."""
    return home / "recall_models"


def read_model(path: Path) -> RelevanceModel:
    """One model file; an unreadable or malformed one is a one-line ValueError naming it."""
    try:
        return RelevanceModel.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError, ValueError) as exc:
        raise ValueError(f"{path}: not a relevance model ({exc})") from None


def load_relevance_model(embedding_model: str, *, home: Path | None = None) -> RelevanceModel:
    """The relevance model for ``embedding_model``: the user's own if fitted, else the shipped one."""
    name = model_file_name(embedding_model)
    if home is not None and (user_models_dir(home) / name).is_file():
        model = read_model(user_models_dir(home) / name)
    else:
        shipped = resources.files(__package__).joinpath(name)
        if not shipped.is_file():
            raise RelevanceModelMissing(
                f"no relevance model is fitted for embedder {embedding_model!r}: run "
                f"`yak eval calibrate --data FILE` (docs/RECALL.md) to fit one")
        model = RelevanceModel.from_dict(json.loads(shipped.read_text(encoding="utf-8")))
    if model.embedding_model != embedding_model:
        raise ValueError(f"relevance model {name} is for {model.embedding_model!r}, not {embedding_model!r}")
    return model
