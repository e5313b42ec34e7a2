"""Ranking metrics against evidence turns: Recall@k, Hit@k, MRR and nDCG@k, and their averages.

A method returns a ranked list of *items* (raw exchanges, or distillations); each item stands for
the set of turns it holds (one turn for an exchange; for a distillation, the turns of the memory
it came from and of any memory merged into it). ``k`` counts items, not turns.

- **Recall@k** — share of the question's evidence turns held by the top ``k`` items.
- **Hit@k** — 1 when the top ``k`` items hold any evidence turn.
- **MRR** — 1 / rank of the first item holding an evidence turn, within the retrieved list
  (as long as the largest ``k``), else 0.
- **nDCG@k** — gain of an item = evidence turns it holds that no better-ranked item held;
  ``DCG = Σ gain_i / log2(i + 1)``, divided by the ideal (one new evidence turn per rank for
  ``min(|evidence|, k)`` ranks) and capped at 1 (one merged item can hold two evidence turns).

Two per-question measures outside that set (``eval.file_report`` averages them over the
questions they apply to):

- **Current first** (:func:`current_first`, knowledge updates) — 1 when the newer statement is
  in the top ``k`` and ranks above every item holding only the statement it superseded.
- **Abstained** (:func:`abstained`, never-said questions) — 1 when nothing was returned.

And the measures of the *block*, the memories actually injected (:func:`block_scores`):
precision (share of its memories that hold an evidence turn; none for an empty block), recall
(share of evidence turns it holds), size, and for a knowledge update whether a memory holding
only the superseded statement comes before every memory holding the current one (stale lead).
For a question that tests a standing instruction or preference, :func:`profile_hit`: whether the
block — its profile part or its recalled part — holds an evidence turn.

Two summaries the report uses for any figure: :func:`mean_or_none` (a measure over the questions
it applies to) and :func:`percentile` (latencies).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


def metric_names(ks: Sequence[int]) -> list[str]:
    """The metric keys for ``ks``, in display order."""
    names = [f"recall@{k}" for k in ks] + [f"hit@{k}" for k in ks] + ["mrr"] + [f"ndcg@{k}" for k in ks]
    return names


def score_ranking(items: Sequence[Iterable[str]], evidence: Iterable[str], ks: Sequence[int]) -> dict[str, float]:
    """Every metric for one ranked list of items (each the turn ids it holds) against ``evidence``."""
    wanted = frozenset(evidence)
    if not wanted:
        raise ValueError("a question needs at least one evidence turn")
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"ks must be positive, got {list(ks)}")
    depth = max(ks)
    ranked = [frozenset(item) for item in items][:depth]
    gains: list[int] = []
    covered: set[str] = set()
    first_hit = 0
    for rank, item in enumerate(ranked, start=1):
        new = (item & wanted) - covered
        gains.append(len(new))
        covered |= new
        if first_hit == 0 and item & wanted:
            first_hit = rank
    scores: dict[str, float] = {}
    for k in ks:
        found = set().union(*ranked[:k]) & wanted if ranked[:k] else set()
        scores[f"recall@{k}"] = len(found) / len(wanted)
        scores[f"hit@{k}"] = 1.0 if found else 0.0
        dcg = sum(g / math.log2(i + 2) for i, g in enumerate(gains[:k]))
        ideal = sum(1.0 / math.log2(i + 2) for i in range(min(len(wanted), k)))
        scores[f"ndcg@{k}"] = min(1.0, dcg / ideal)
    scores["mrr"] = 1.0 / first_hit if first_hit else 0.0
    return {name: scores[name] for name in metric_names(ks)}


def current_first(items: Sequence[Iterable[str]], evidence: Iterable[str], superseded: Iterable[str],
                  k: int = 5) -> float:
    """1.0 when the current statement is recalled within the top ``k`` and ahead of the old one, else 0.0.

    ``items`` is a ranked list as for :func:`score_ranking` (each item the turn ids it holds),
    ``evidence`` the turns stating the current value, ``superseded`` the earlier turns stating
    the value it replaced. The score is 1.0 when the first item holding an evidence turn is within
    the top ``k`` and no item holding a superseded turn (and no evidence turn) ranks above it. An
    item holding both (a consolidated memory, or one versioned over the old) counts as current;
    a superseded turn that is not retrieved at all, or only below the first evidence item, does
    no harm. With no superseded turns this is Hit@k. A turn listed in both is taken as evidence.
    """
    wanted = frozenset(evidence)
    if not wanted:
        raise ValueError("a question needs at least one evidence turn")
    if k < 1:
        raise ValueError(f"k must be positive, got {k}")
    stale = frozenset(superseded) - wanted
    for rank, item in enumerate(items, start=1):
        if rank > k:
            return 0.0
        held = frozenset(item)
        if held & wanted:
            return 1.0
        if held & stale:
            return 0.0
    return 0.0


def abstained(items: Iterable[object]) -> float:
    """1.0 when the ranked list is empty (the method returned nothing), else 0.0.

    For a question about something never said, returning nothing is the right answer; an item
    holding no turns is still something returned.
    """
    return 0.0 if any(True for _ in items) else 1.0


# BEAM's abilities whose questions never mention what they test: the profile's (issue 39).
PROFILE_ABILITIES = frozenset({"instruction_following", "preference_following"})


def profile_hit(block: Sequence[Iterable[str]], profile: Sequence[Iterable[str]], evidence: Iterable[str]) -> float:
    """1.0 when the block's recalled memories or its profile lines (each the turn ids it holds)
    hold an evidence turn, else 0.0."""
    wanted = frozenset(evidence)
    return float(any(wanted & frozenset(item) for item in [*block, *profile]))


def block_scores(block: Sequence[Iterable[str]], evidence: Iterable[str],
                 superseded: Iterable[str] = ()) -> dict[str, float | None]:
    """The block's ``precision`` (None when empty), ``recall``, ``size`` and ``stale_lead`` (None
    without superseded turns) for one answerable question; ``block`` is the injected memories in
    order, each the turn ids it holds."""
    wanted = frozenset(evidence)
    if not wanted:
        raise ValueError("a question needs at least one evidence turn")
    items = [frozenset(item) for item in block]
    stale = frozenset(superseded) - wanted
    lead: float | None = None
    if stale:
        # The first memory holding either statement decides which one the model reads first.
        first = next((item for item in items if item & (wanted | stale)), frozenset())
        lead = 1.0 if first & stale and not first & wanted else 0.0
    return {
        "precision": sum(1.0 for item in items if item & wanted) / len(items) if items else None,
        "recall": len(set().union(*items) & wanted) / len(wanted) if items else 0.0,
        "size": float(len(items)),
        "stale_lead": lead,
    }


@dataclass(frozen=True)
class ScoredQuestion:
    """One question's metrics for one method, with its category."""

    category: int
    scores: Mapping[str, float]


def aggregate(results: Iterable[ScoredQuestion], ks: Sequence[int]) -> dict[str, dict[str, float]]:
    """Mean of each metric overall and per category, each with its question count ``n``.

    Keys: ``"overall"`` and the category numbers as strings (``"1"`` …), in ascending order.
    """
    names = metric_names(ks)
    groups: dict[str, list[Mapping[str, float]]] = {"overall": []}
    for result in results:
        groups["overall"].append(result.scores)
        groups.setdefault(str(result.category), []).append(result.scores)
    out: dict[str, dict[str, float]] = {}
    for key in ["overall"] + sorted((k for k in groups if k != "overall"), key=int):
        rows = groups[key]
        summary: dict[str, float] = {"n": float(len(rows))}
        for name in names:
            summary[name] = sum(r[name] for r in rows) / len(rows) if rows else 0.0
        out[key] = summary
    return out


def mean_or_none(values: Sequence[float]) -> float | None:
    """The mean, rounded, or None when there is nothing to average (the measure does not apply)."""
    return round(sum(values) / len(values), 4) if values else None


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of already sorted values (0 for none)."""
    if not sorted_values:
        return 0.0
    rank = max(1, min(len(sorted_values), round(pct / 100 * len(sorted_values) + 0.5)))
    return float(sorted_values[rank - 1])
