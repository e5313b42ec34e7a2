"""The confidence gate: exact boundaries, and malformed confidence rejected rather than clamped."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from yak_pipeline.core.gates import (
    ACTIVE_CONFIDENCE,
    REVIEW_CONFIDENCE,
    GateDecision,
    InvalidConfidence,
    confidence_gate,
)

ACTIVE = GateDecision(status="active", needs_review=False)
ACTIVE_FLAGGED = GateDecision(status="active", needs_review=True)
REVIEW = GateDecision(status="review", needs_review=True)


@pytest.mark.parametrize(
    ("confidence", "expected"),
    [
        (1.0, ACTIVE),
        (0.8, ACTIVE),
        (0.7999999, ACTIVE_FLAGGED),
        (0.7, ACTIVE_FLAGGED),
        (0.6, ACTIVE_FLAGGED),
        (0.5999999, REVIEW),
        (0.0, REVIEW),
        (1, ACTIVE),
        (0, REVIEW),
    ],
)
def test_gate_boundaries(confidence: float, expected: GateDecision) -> None:
    assert confidence_gate(confidence) == expected


def test_constants_match_the_design() -> None:
    assert (ACTIVE_CONFIDENCE, REVIEW_CONFIDENCE) == (0.8, 0.6)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -0.0001, 1.0001, 80, -1, True, False, "0.9", None])
def test_malformed_confidence_is_rejected_not_clamped(bad: object) -> None:
    with pytest.raises(InvalidConfidence) as raised:
        confidence_gate(bad)  # type: ignore[arg-type]
    message = str(raised.value)
    assert "confidence" in message and "\n" not in message
    assert isinstance(raised.value, ValueError)


@given(st.floats(0.0, 1.0))
def test_gate_follows_the_rule_for_every_valid_confidence(confidence: float) -> None:
    decision = confidence_gate(confidence)
    assert decision.status == ("active" if confidence >= 0.6 else "review")
    assert decision.needs_review == (confidence < 0.8)


@given(st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not 0.0 <= x <= 1.0))
def test_every_out_of_range_float_is_rejected(confidence: float) -> None:
    with pytest.raises(InvalidConfidence):
        confidence_gate(confidence)
