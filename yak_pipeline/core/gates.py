"""The confidence gate (DESIGN §4): what status a new distillation gets from the LLM's confidence."""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real
from typing import Final, Literal

ACTIVE_CONFIDENCE: Final[float] = 0.8
REVIEW_CONFIDENCE: Final[float] = 0.6


class InvalidConfidence(ValueError):
    """A confidence that is not a finite number in [0, 1]; it is rejected, never clamped."""


@dataclass(frozen=True)
class GateDecision:
    """The status a distillation is stored with, and whether a person should look at it."""

    status: Literal["active", "review"]
    needs_review: bool


def validate_confidence(confidence: object) -> float:
    """Return ``confidence`` as a float, or raise :class:`InvalidConfidence` saying why."""
    # bool is an int subclass; True from a malformed LLM answer must not read as confidence 1.0.
    if isinstance(confidence, bool) or not isinstance(confidence, Real):
        raise InvalidConfidence(f"confidence must be a number in [0, 1], got {confidence!r}")
    value = float(confidence)
    if math.isnan(value) or math.isinf(value):
        raise InvalidConfidence(f"confidence must be a finite number in [0, 1], got {value!r}")
    if not 0.0 <= value <= 1.0:
        raise InvalidConfidence(f"confidence {value!r} is outside [0, 1]")
    return value


def confidence_gate(confidence: float) -> GateDecision:
    """≥ 0.8 → active; 0.6–0.8 → active and flagged for review; < 0.6 → review (never recalled)."""
    value = validate_confidence(confidence)
    if value >= ACTIVE_CONFIDENCE:
        return GateDecision(status="active", needs_review=False)
    if value >= REVIEW_CONFIDENCE:
        return GateDecision(status="active", needs_review=True)
    return GateDecision(status="review", needs_review=True)
