"""Warmth: the per-turn nudge, its clamping, and the change recorded in warmth_events."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from yak_pipeline.core.unit_scores import InvalidScore
from yak_pipeline.core.warmth import (
    WARMTH_DEFAULT,
    WarmthChange,
    apply_warmth_delta,
    evaluate_warmth,
    warmth_delta,
)


@pytest.mark.parametrize(
    ("relevance", "delta"),
    [(1.0, 0.1), (0.71, 0.1), (0.7, 0.0), (0.5, 0.0), (0.3, 0.0), (0.29, -0.2), (0.0, -0.2)],
)
def test_warmth_delta_thresholds_are_strict(relevance: float, delta: float) -> None:
    assert warmth_delta(relevance) == delta


@pytest.mark.parametrize("bad", [math.nan, -0.01, 1.01, math.inf, True, "0.5"])
def test_invalid_relevance_is_rejected(bad: object) -> None:
    with pytest.raises(InvalidScore, match="relevance"):
        warmth_delta(bad)  # type: ignore[arg-type]


def test_apply_warmth_delta_clamps_and_avoids_float_drift() -> None:
    assert apply_warmth_delta(0.95, 0.1) == 1.0
    assert apply_warmth_delta(0.1, -0.2) == 0.0
    assert apply_warmth_delta(0.2, 0.1) == 0.3  # not 0.30000000000000004
    with pytest.raises(ValueError):
        apply_warmth_delta(math.nan, 0.1)


def test_evaluate_warmth_records_the_applied_change() -> None:
    assert evaluate_warmth(WARMTH_DEFAULT, 0.9) == WarmthChange(before=0.5, delta=0.1, after=0.6)
    assert evaluate_warmth(0.1, 0.0) == WarmthChange(before=0.1, delta=-0.1, after=0.0)
    assert evaluate_warmth(1.0, 0.95) == WarmthChange(before=1.0, delta=0.0, after=1.0)
    assert evaluate_warmth(0.4, 0.5) == WarmthChange(before=0.4, delta=0.0, after=0.4)


@given(start=st.floats(0.0, 1.0), relevances=st.lists(st.floats(0.0, 1.0), max_size=60))
def test_warmth_stays_in_unit_interval_over_any_sequence(start: float, relevances: list[float]) -> None:
    warmth = start
    for relevance in relevances:
        change = evaluate_warmth(warmth, relevance)
        assert 0.0 <= change.after <= 1.0
        assert change.before == warmth
        assert change.after == pytest.approx(change.before + change.delta, abs=1e-9)
        # Clamping may shrink the nudge but never reverse it or make it larger.
        nudge = warmth_delta(relevance)
        assert abs(change.delta) <= abs(nudge) + 1e-9 and change.delta * nudge >= 0
        warmth = change.after
