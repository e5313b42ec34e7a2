"""Recall scoring (DESIGN §4): the tier-scaled gate and the factors of the score.

The recall ranking itself (calibrated relevance, the gate, the score and the order) is
``core.recall.rank_memories``; it builds on the pieces here.
"""

from __future__ import annotations

import math
from typing import Final

from yak_pipeline.core.types import TIERS, Tier

TIER_GRAVITY: Final[dict[Tier, float]] = {"core": 2.0, "medium": 1.0, "low": 0.5}
DEFAULT_CORE_MULTIPLIER: Final[float] = 2.0

# Similarities come back from pgvector as float4/float8 arithmetic, so a row sitting exactly on
# the gate boundary can land a few ulps outside it; this tolerance lets it pass.
GATE_EPSILON: Final[float] = 1e-9


def _check_tier(tier: str) -> Tier:
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}: use one of {', '.join(TIERS)}")
    return tier


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


def decay_factor(age_days: float, half_life_days: float, enabled: bool = True) -> float:
    """``exp(-ln 2 × age / half_life)``; 1.0 when decay is disabled; future-dated ages count as 0."""
    return math.exp(log_decay_factor(age_days, half_life_days, enabled))


def log_decay_factor(age_days: float, half_life_days: float, enabled: bool = True) -> float:
    """``ln`` of :func:`decay_factor`, computed as such: it stays finite (and keeps old memories in
    order) where the factor itself would underflow to 0 (an age of over a thousand half-lives)."""
    if not enabled:
        return 0.0
    if math.isnan(age_days):
        raise ValueError("age_days is NaN")
    if not half_life_days > 0 or math.isinf(half_life_days):
        raise ValueError(f"half_life_days must be a positive finite number, got {half_life_days!r}")
    return -math.log(2.0) * max(age_days, 0.0) / half_life_days


def gravity(tier: Tier, user_weight: float) -> float:
    """The tier's gravity times the user's own weight for the memory."""
    return TIER_GRAVITY[_check_tier(tier)] * user_weight
