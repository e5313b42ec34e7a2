"""Recall scoring: the tier gate and the factors of the score (the ranking is tested in test_core_recall)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from yak_pipeline.core.scoring import (
    TIER_GRAVITY,
    decay_factor,
    gravity,
    passes_tier_gate,
    tier_threshold_multiplier,
)


def test_tier_multipliers_and_gravity_follow_the_design() -> None:
    assert TIER_GRAVITY == {"core": 2.0, "medium": 1.0, "low": 0.5}
    assert tier_threshold_multiplier("core") == 2.0
    assert tier_threshold_multiplier("core", core_multiplier=3.0) == 3.0
    assert tier_threshold_multiplier("medium") == 1.0
    assert tier_threshold_multiplier("low") == 0.5
    assert gravity("core", 1.5) == 3.0
    assert gravity("low", 2.0) == 1.0
    with pytest.raises(ValueError, match="unknown tier"):
        tier_threshold_multiplier("high")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("tier", "boundary_similarity"),
    [("core", 0.4), ("medium", 0.7), ("low", 0.85)],  # threshold 0.7: distance 0.3 × m_tier
)
def test_tier_gate_passes_exactly_at_its_boundary_and_not_beyond(tier: str, boundary_similarity: float) -> None:
    assert passes_tier_gate(boundary_similarity, 0.7, tier)
    assert passes_tier_gate(boundary_similarity + 1e-6, 0.7, tier)
    assert not passes_tier_gate(boundary_similarity - 1e-6, 0.7, tier)


def test_tier_gate_tolerates_float_noise_at_the_boundary() -> None:
    # 1 - 0.7 is 0.30000000000000004 in floats; the similarity pgvector returns may be a few ulps off.
    assert passes_tier_gate(math.nextafter(0.7, 0.0), 0.7, "medium")
    assert passes_tier_gate(1.0 - 0.3 * 0.5 - 1e-12, 0.7, "low")


@given(threshold=st.floats(0.0, 1.0), core=st.floats(0.1, 4.0), relevance=st.floats(0.0, 1.0))
def test_a_wider_tier_passes_whatever_a_narrower_one_passes(threshold: float, core: float, relevance: float) -> None:
    if passes_tier_gate(relevance, threshold, "low", core):
        assert passes_tier_gate(relevance, threshold, "medium", core)
    if passes_tier_gate(relevance, threshold, "medium", core) and core >= 1.0:
        assert passes_tier_gate(relevance, threshold, "core", core)
    assert passes_tier_gate(1.0, threshold, "low", core)  # a perfect match passes every gate
    assert passes_tier_gate(relevance, 0.0, "medium", core)  # t = 0 lets everything through medium


def test_decay_halves_every_half_life_and_ignores_the_future() -> None:
    assert decay_factor(0, 30) == 1.0
    assert decay_factor(30, 30) == pytest.approx(0.5)
    assert decay_factor(90, 30) == pytest.approx(0.125)
    assert decay_factor(-5, 30) == 1.0
    assert decay_factor(1000, 30, enabled=False) == 1.0
    with pytest.raises(ValueError, match="half_life_days"):
        decay_factor(1, 0)


