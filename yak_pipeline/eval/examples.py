"""The relevance model's labelled examples, made from the collected questions (``eval.collection``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from yak_pipeline.core.relevance import ANSWERABLE_FEATURES, FEATURES, relevance_features
from yak_pipeline.eval.calibrate import Examples
from yak_pipeline.eval.collection import CollectedFile, best_cosines


def examples_from(files: Sequence[CollectedFile]) -> Examples:
    """The labelled examples of the collected questions (``eval.calibrate``'s module docstring).

    Each candidate of each question is a row (``FEATURES`` order), relevant when it holds one of
    the question's evidence turns; never-said questions give only negatives. Query-level rows
    (the answerability factor): each answerable question whose evidence some candidate holds (1),
    each never-said question (0), and each question asked of another person's memories (0). Every
    row names its conversation (and a stranger row also the other person's), for the folds.
    """
    rows: list[list[float]] = []
    labels: list[int] = []
    files_of: list[str] = []
    conversations: list[str] = []
    q_rows: list[list[float]] = []
    q_labels: list[int] = []
    q_files: list[str] = []
    q_conversations: list[str] = []
    q_others: list[str] = []
    for collected in files:
        keys = [c.key for c in collected.ingested]
        for asked in collected.asked:
            key = asked.conversation.key
            relevant = [1 if asked.held.get((c.kind, c.id), frozenset()) & asked.question.evidence else 0
                        for c in asked.candidates]
            for candidate, is_relevant in zip(asked.candidates, relevant):
                features = relevance_features(candidate.signals)
                rows.append([features[name] for name in FEATURES])
                labels.append(is_relevant)
                files_of.append(collected.label)
                conversations.append(key)
            best = best_cosines(asked.candidates)
            # An answerable question whose evidence no leg found teaches nothing here.
            if best is not None and (any(relevant) or not asked.question.evidence):
                q_rows.append(best)
                q_labels.append(1 if any(relevant) else 0)
                q_files.append(collected.label)
                q_conversations.append(key)
                q_others.append(key)
            if asked.stranger_best is not None:
                q_rows.append(asked.stranger_best)
                q_labels.append(0)
                q_files.append(collected.label)
                q_conversations.append(key)
                q_others.append(keys[(keys.index(key) + 1) % len(keys)])
    return Examples(
        np.asarray(rows, dtype=np.float64).reshape(-1, len(FEATURES)), np.asarray(labels, dtype=np.float64),
        np.asarray(files_of, dtype=object), np.asarray(conversations, dtype=object),
        np.asarray(q_rows, dtype=np.float64).reshape(-1, len(ANSWERABLE_FEATURES)),
        np.asarray(q_labels, dtype=np.float64), np.asarray(q_files, dtype=object),
        np.asarray(q_conversations, dtype=object), np.asarray(q_others, dtype=object))
