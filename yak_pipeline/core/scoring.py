"""Recall scoring (DESIGN §4): the tier-scaled similarity gate, the score, and the reference ranking.

``rank_candidates`` is the one definition of recall order: the SQL store re-ranks its ANN
candidates with it, and tests compare every other path against it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from yak_pipeline.core.types import TIERS, Tier

TIER_GRAVITY: Final[dict[Tier, float]] = {"core": 2.0, "medium": 1.0, "low": 0.5}
DEFAULT_CORE_MULTIPLIER: Final[float] = 2.0

# Similarities come back from pgvector as float4/float8 arithmetic, so a row sitting exactly on
# the gate boundary can land a few ulps outside it; this tolerance lets it pass.
GATE_EPSILON: Final[float] = 1e-9

# The score and its upper bound multiply the same factors in different orders, so they can
# differ in the last bits; the bound is inflated by this much so it stays a true upper bound.
_BOUND_SLACK: Final[float] = 1e-9

_MAX_DECAY: Final[float] = 1.0
_MAX_WARMTH_FACTOR: Final[float] = 2.0  # 1 + warmth, warmth ≤ 1
_SECONDS_PER_DAY: Final[float] = 86_400.0


def _check_tier(tier: str) -> Tier:
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}: use one of {', '.join(TIERS)}")
    return tier  # type: ignore[return-value]


def tier_threshold_multiplier(tier: Tier, core_multiplier: float = DEFAULT_CORE_MULTIPLIER) -> float:
    """How much wider (or narrower) than the base distance ``tier``'s similarity gate is."""
    _check_tier(tier)
    if tier == "core":
        return float(core_multiplier)
    return 1.0 if tier == "medium" else 0.5


def passes_tier_gate(
    similarity: float, threshold: float, tier: Tier, core_multiplier: float = DEFAULT_CORE_MULTIPLIER
) -> bool:
    """True when ``1 - similarity <= (1 - threshold) * m_tier`` (within :data:`GATE_EPSILON`)."""
    allowed = (1.0 - threshold) * tier_threshold_multiplier(tier, core_multiplier)
    return 1.0 - similarity <= allowed + GATE_EPSILON


def max_gate_distance(threshold: float, core_multiplier: float = DEFAULT_CORE_MULTIPLIER) -> float:
    """The widest cosine distance any tier can pass; rows further away need not be fetched.

    Includes :data:`GATE_EPSILON`, so it bounds exactly what :func:`passes_tier_gate` accepts.
    """
    # low's multiplier (0.5) is never the widest; medium's 1.0 is when core is configured below it.
    return (1.0 - threshold) * max(float(core_multiplier), 1.0) + GATE_EPSILON


def decay_factor(age_days: float, half_life_days: float, enabled: bool = True) -> float:
    """``exp(-ln 2 × age / half_life)``; 1.0 when decay is disabled; future-dated ages count as 0."""
    if not enabled:
        return 1.0
    if math.isnan(age_days):
        raise ValueError("age_days is NaN")
    if not half_life_days > 0 or math.isinf(half_life_days):
        raise ValueError(f"half_life_days must be a positive finite number, got {half_life_days!r}")
    return math.exp(-math.log(2.0) * max(age_days, 0.0) / half_life_days)


def gravity(tier: Tier, user_weight: float) -> float:
    """The tier's gravity times the user's own weight for the memory."""
    return TIER_GRAVITY[_check_tier(tier)] * user_weight


def recall_score(
    similarity: float,
    *,
    age_days: float,
    warmth: float,
    tier: Tier,
    user_weight: float,
    half_life_days: float,
    decay_enabled: bool = True,
) -> float:
    """``similarity × decay × (1 + warmth) × gravity`` (DESIGN §4)."""
    decay = decay_factor(age_days, half_life_days, decay_enabled)
    return similarity * decay * (1.0 + warmth) * gravity(tier, user_weight)


@dataclass(frozen=True)
class RecallCandidate:
    """One active distillation proposed for recall, with its similarity to the query."""

    id: str
    similarity: float
    tier: Tier
    warmth: float
    user_weight: float
    refreshed_at: datetime

    def __post_init__(self) -> None:
        _check_tier(self.tier)
        # A naive timestamp would make the age depend on the server's local time zone.
        if self.refreshed_at.tzinfo is None or self.refreshed_at.utcoffset() is None:
            raise ValueError(f"refreshed_at of {self.id} must be timezone-aware")


@dataclass(frozen=True)
class ScoredMemory:
    """A candidate that passed its tier gate, with its recall score."""

    id: str
    similarity: float
    tier: Tier
    warmth: float
    user_weight: float
    refreshed_at: datetime
    score: float


def _age_days(now: datetime, refreshed_at: datetime) -> float:
    return (now - refreshed_at).total_seconds() / _SECONDS_PER_DAY


def ranking_key(memory: ScoredMemory) -> tuple[float, float, str]:
    """The sort key of recall order: best score, then most similar, then id, so ties are stable."""
    return (-memory.score, -memory.similarity, memory.id)


def rank_candidates(
    candidates: Iterable[RecallCandidate],
    *,
    threshold: float,
    limit: int,
    now: datetime,
    half_life_days: float,
    decay_enabled: bool = True,
    core_multiplier: float = DEFAULT_CORE_MULTIPLIER,
) -> list[ScoredMemory]:
    """The reference recall: gate each candidate by tier, score it, and return the best ``limit``."""
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be timezone-aware")
    scored = [
        ScoredMemory(
            id=c.id,
            similarity=c.similarity,
            tier=c.tier,
            warmth=c.warmth,
            user_weight=c.user_weight,
            refreshed_at=c.refreshed_at,
            score=recall_score(
                c.similarity,
                age_days=_age_days(now, c.refreshed_at),
                warmth=c.warmth,
                tier=c.tier,
                user_weight=c.user_weight,
                half_life_days=half_life_days,
                decay_enabled=decay_enabled,
            ),
        )
        for c in candidates
        if passes_tier_gate(c.similarity, threshold, c.tier, core_multiplier)
    ]
    scored.sort(key=ranking_key)
    return scored[:limit]


def score_upper_bound(
    similarity: float,
    max_user_weight: float,
    *,
    threshold: float | None = None,
    core_multiplier: float = DEFAULT_CORE_MULTIPLIER,
) -> float:
    """The highest score any row with similarity ≤ ``similarity`` could reach.

    Decay ≤ 1, 1 + warmth ≤ 2 and gravity ≤ tier gravity × ``max_user_weight``; a negative
    similarity can only give a negative score, so its bound is 0. With ``threshold`` the bound
    is tighter: a tier whose gate no row that far away can pass does not count, so once the
    fetched rows are below medium's gate only core rows (and their gravity) are left to fear.
    """
    gravities = [
        TIER_GRAVITY[tier] for tier in TIERS
        if threshold is None or passes_tier_gate(similarity, threshold, tier, core_multiplier)
    ]
    if not gravities:
        return 0.0
    return max(similarity, 0.0) * _MAX_DECAY * _MAX_WARMTH_FACTOR * max(gravities) * max_user_weight


def can_stop_fetching(
    ranked_so_far: Sequence[ScoredMemory],
    limit: int,
    last_similarity: float,
    max_user_weight: float,
    *,
    threshold: float | None = None,
    core_multiplier: float = DEFAULT_CORE_MULTIPLIER,
) -> bool:
    """True when no row less similar than ``last_similarity`` could enter the top ``limit``.

    ``ranked_so_far`` is :func:`rank_candidates` over every row fetched so far (fetched in
    descending similarity). The comparison is strict and the bound slightly inflated: a later
    row scoring exactly the limit-th score could still win the similarity/id tie-break.
    ``threshold`` (and ``core_multiplier``), when given, must be those of the ranking: they
    let the bound skip tiers whose gate the remaining rows cannot pass.
    """
    if limit <= 0:
        return True
    if len(ranked_so_far) < limit:
        return False
    bound = score_upper_bound(last_similarity, max_user_weight, threshold=threshold,
                              core_multiplier=core_multiplier)
    return ranked_so_far[limit - 1].score > bound + _BOUND_SLACK * max(abs(bound), 1.0)
