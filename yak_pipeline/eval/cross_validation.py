"""Conversation-level K-fold cross-validation of the relevance model.

Conversations are assigned to folds round-robin within each file (:func:`assign_folds`); each
fold's model is fitted on the examples of the other folds' conversations only (all files
together; each file weighted equally, the classes equally), so the "Yak" figure ranks every
conversation with a model that never saw it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from yak_pipeline.core.relevance import RelevanceModel
from yak_pipeline.eval.calibrate import Examples, fit_model
from yak_pipeline.eval.collection import CollectedFile
from yak_pipeline.eval.ingest import conversation_key
from yak_pipeline.eval.methods import YAK
from yak_pipeline.eval.options import Progress, quiet


def assign_folds(files: Sequence[tuple[str, int]], folds: int) -> dict[str, int]:
    """Each conversation's fold, by key (:func:`conversation_key`), from ``(file label, conversations)`` pairs.

    Round-robin within each file, continuing where the previous file stopped: file by file in the
    order given, conversation by conversation in file order, fold ``(offset + i) % folds``. Every
    file is spread over the folds (a file of at least two conversations is in every fold's
    training set), the folds differ in size by at most one, and the assignment depends only on
    the order of the files and of their conversations.
    """
    if folds < 2:
        raise ValueError(f"cross-validation needs at least 2 folds, got {folds}")
    assignment: dict[str, int] = {}
    offset = 0
    for label, count in files:
        for index in range(count):
            assignment[conversation_key(label, index)] = (offset + index) % folds
        offset += count
    return assignment


@dataclass
class CrossValidation:
    """The folds and each fold's model (fitted without the fold's conversations)."""

    folds: int
    assignment: dict[str, int]
    models: dict[int, RelevanceModel]
    # Folds whose model could not be fitted, with why (their conversations use the fallback).
    failed: dict[int, str]
    fallback: RelevanceModel
    # Per fold: the conversations it holds and how many examples its model was fitted on.
    trained: dict[int, dict[str, Any]] = field(default_factory=dict)

    def model_for(self, key: str) -> RelevanceModel:
        """The model that ranks conversation ``key``: its fold's, or the fallback if that one failed."""
        return self.models.get(self.assignment[key], self.fallback)


def cross_validate(examples: Examples, files: Sequence[tuple[str, int]], folds: int, *, embedding_model: str,
                   fallback: RelevanceModel, progress: Progress = quiet) -> CrossValidation | None:
    """Fit one model per fold on the examples of the other folds' conversations; None below 2 conversations."""
    total = sum(count for _, count in files)
    if total < 2:
        return None
    k = min(folds, total)
    assignment = assign_folds(files, k)
    models: dict[int, RelevanceModel] = {}
    failed: dict[int, str] = {}
    trained: dict[int, dict[str, Any]] = {}
    for fold in range(k):
        held_out = frozenset(key for key, f in assignment.items() if f == fold)
        trained[fold] = {"held_out": sorted(held_out),
                         "examples": int((~np.isin(examples.conversations, list(held_out))).sum())}
        try:
            models[fold] = fit_model(examples, embedding_model=embedding_model, exclude=held_out,
                                     version=f"{embedding_model}@fold-{fold + 1}-of-{k}")
        except ValueError as exc:
            failed[fold] = str(exc)
            progress(f"fold {fold + 1}/{k}: cannot fit ({exc}); its conversations use {fallback.version}")
        else:
            progress(f"fold {fold + 1}/{k}: fitted on {trained[fold]['examples']} examples "
                     f"(without {len(held_out)} conversations)")
    return CrossValidation(folds=k, assignment=assignment, models=models, failed=failed, fallback=fallback,
                           trained=trained)


def evaluation_note(cv: CrossValidation | None, files: Sequence[CollectedFile]) -> str:
    """How the "Yak" figure was obtained, in words (the JSON's ``evaluation``)."""
    total = sum(len(f.ingested) for f in files)
    if cv is None:
        return (f"no cross-validation: {total} conversation(s), at least 2 are needed; "
                f"\"{YAK}\" uses the in-sample model (or the shipped one if it could not be fitted)")
    scope = (f"the {total} conversations of all {len(files)} files together" if len(files) > 1
             else f"the {total} conversations of the one file given (within that file)")
    note = (f"conversation-level {cv.folds}-fold cross-validation over {scope}: folds assigned round-robin "
            f"within each file; each conversation ranked by a model fitted without its fold")
    if cv.failed:
        note += (f"; folds {', '.join(str(f + 1) for f in sorted(cv.failed))} could not be fitted and rank "
                 f"with {cv.fallback.version}")
    return note


def cross_validation_report(cv: CrossValidation | None, files: Sequence[CollectedFile]) -> dict[str, Any]:
    """The report's ``cross_validation`` section: the folds, the note, and (when cross-validated)
    each conversation's fold by file and each fold model's version, held-out count and examples."""
    section: dict[str, Any] = {"folds": cv.folds if cv else 0, "note": evaluation_note(cv, files)}
    if cv is not None:
        by_file: dict[str, dict[str, int]] = {}
        for collected in files:
            by_file[collected.label] = {c.source.sample_id: cv.assignment[c.key] + 1 for c in collected.ingested}
        section.update({
            "within_one_file": len(files) == 1,
            "assignment": by_file,
            "fold_models": {str(fold + 1): {"version": cv.models[fold].version if fold in cv.models else None,
                                            "held_out_conversations": len(cv.trained[fold]["held_out"]),
                                            "training_examples": cv.trained[fold]["examples"],
                                            "failed": cv.failed.get(fold)}
                            for fold in range(cv.folds)},
        })
    return section
