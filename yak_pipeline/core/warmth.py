"""Warmth (DESIGN §4): how a memory's usefulness in a turn nudges its recall score."""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Final

from yak_pipeline.core.unit_scores import unit_score

WARMTH_DEFAULT: Final[float] = 0.5
WARMTH_UP: Final[float] = 0.1
WARMTH_DOWN: Final[float] = 0.2
USEFUL_ABOVE: Final[float] = 0.7
USELESS_BELOW: Final[float] = 0.3

# Repeated ±0.1 steps would otherwise drift to values like 0.30000000000000004.
_DECIMALS: Final[int] = 10


def _finite(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def warmth_delta(relevance: float) -> float:
    """+0.1 when the evaluator found the memory useful (> 0.7), −0.2 when useless (< 0.3), else 0;
    :class:`InvalidScore` when ``relevance`` is not in [0, 1]."""
    value = unit_score(relevance, "relevance")
    if value > USEFUL_ABOVE:
        return WARMTH_UP
    if value < USELESS_BELOW:
        return -WARMTH_DOWN
    return 0.0


def apply_warmth_delta(warmth: float, delta: float) -> float:
    """``warmth + delta`` clamped to [0, 1], rounded to 10 decimals."""
    total = _finite("warmth", warmth) + _finite("delta", delta)
    return round(min(1.0, max(0.0, total)), _DECIMALS)


@dataclass(frozen=True)
class WarmthChange:
    """One warmth update: the value before, the change actually applied, and the value after."""

    before: float
    delta: float
    after: float


def evaluate_warmth(warmth: float, relevance: float) -> WarmthChange:
    """The warmth change for one relevance score; ``delta`` is what clamping left of the nudge."""
    before = _finite("warmth", warmth)
    after = apply_warmth_delta(before, warmth_delta(relevance))
    return WarmthChange(before=before, delta=round(after - before, _DECIMALS), after=after)
