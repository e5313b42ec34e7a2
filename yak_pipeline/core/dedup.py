"""Near-duplicate and conflict decisions (DESIGN §4) over a new distillation's nearest neighbours."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal

from yak_pipeline.core.unit_scores import unit_score

NEAR_DUPLICATE_SIMILARITY: Final[float] = 0.85
NEAR_DUPLICATE_TOP_K: Final[int] = 5
CONFLICT_SCORE_THRESHOLD: Final[float] = 0.7
CONFLICT_CHECK_MIN_SIMILARITY: Final[float] = 0.5
CONFLICT_CHECK_TOP_K: Final[int] = 5


@dataclass(frozen=True)
class Neighbour:
    """An existing distillation near a new one, as the vector search found it."""

    id: str
    user_id: str
    similarity: float
    status: str
    created_at: datetime


def _most_similar_first(neighbour: Neighbour) -> tuple[float, datetime, str]:
    # Ties go to the older distillation, then the id, so the choice never depends on input order.
    return (-neighbour.similarity, neighbour.created_at, neighbour.id)


def _eligible(new_id: str, new_user_id: str, neighbours: Iterable[Neighbour]) -> list[Neighbour]:
    return [n for n in neighbours if n.user_id == new_user_id and n.status == "active" and n.id != str(new_id)]


def select_near_duplicates(
    new_id: str, new_user_id: str, neighbours: Iterable[Neighbour], conflicting_ids: Collection[str]
) -> list[Neighbour]:
    """The new distillation's near-duplicates, most similar first.

    Same user and active only, never the new one itself, similarity ≥ 0.85, not flagged as a
    conflict with the new one, at most the 5 most similar.
    """
    in_conflict = {str(i) for i in conflicting_ids}
    duplicates = [
        n
        for n in _eligible(new_id, new_user_id, neighbours)
        if n.similarity >= NEAR_DUPLICATE_SIMILARITY and n.id not in in_conflict
    ]
    return sorted(duplicates, key=_most_similar_first)[:NEAR_DUPLICATE_TOP_K]


def choose_merge_target(near_duplicates: Sequence[Neighbour]) -> Neighbour | None:
    """The existing distillation the new one merges into (the most similar), or None.

    The target keeps its identity and gets a new version; the new distillation becomes ``merged``.
    """
    return min(near_duplicates, key=_most_similar_first, default=None)


def is_conflict(score: float) -> bool:
    """True when the LLM's contradiction score is strictly above 0.7; :class:`InvalidScore` when it is not in [0, 1]."""
    return unit_score(score, "conflict score") > CONFLICT_SCORE_THRESHOLD


def conflict_candidates(
    new_id: str,
    new_user_id: str,
    neighbours: Iterable[Neighbour],
    min_similarity: float = CONFLICT_CHECK_MIN_SIMILARITY,
    top_k: int = CONFLICT_CHECK_TOP_K,
) -> list[Neighbour]:
    """The neighbours worth an LLM contradiction check: same user, active, not itself, most similar first.

    Contradictions are about the same subject, so only reasonably similar ones are asked about.
    """
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    similar = [n for n in _eligible(new_id, new_user_id, neighbours) if n.similarity >= min_similarity]
    return sorted(similar, key=_most_similar_first)[:top_k]


def newer_side(said_a: datetime, said_b: datetime) -> Literal["a", "b"] | None:
    """Which side of a conflict was said later (by its exchange's time, as supersession judges
    it); None when both were said at the same moment and neither can be called newer."""
    if said_a == said_b:
        return None
    return "a" if said_a > said_b else "b"
