"""Scores in [0, 1] as the core's decisions take them: an LLM's contradiction score, an evaluator's
relevance. One check, so every score is refused the same way and the reason names it."""

from __future__ import annotations

from numbers import Real


class InvalidScore(ValueError):
    """A score that is not a number in [0, 1]; the message names the score."""


def unit_score(value: object, name: str) -> float:
    """``value`` as a float in [0, 1]; :class:`InvalidScore` naming ``name`` when it is not a number
    or lies outside [0, 1] (NaN and infinities included)."""
    # bool is an int subclass; True from a malformed LLM answer must not read as 1.0.
    if isinstance(value, bool) or not isinstance(value, Real):
        raise InvalidScore(f"{name} must be a number in [0, 1], got {value!r}")
    number = float(value)
    if not 0.0 <= number <= 1.0:  # also false for NaN
        raise InvalidScore(f"{name} {number!r} is outside [0, 1]")
    return number
