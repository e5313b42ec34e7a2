"""Recall scoring: the tier gate, the score, the reference ranking and the early-stop bound."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from yak_pipeline.core.scoring import (
    TIER_GRAVITY,
    RecallCandidate,
    ScoredMemory,
    can_stop_fetching,
    decay_factor,
    gravity,
    max_gate_distance,
    passes_tier_gate,
    rank_candidates,
    recall_score,
    score_upper_bound,
    tier_threshold_multiplier,
)
from yak_pipeline.core.types import TIERS

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def _candidate(id: str, similarity: float, tier: str = "medium", warmth: float = 0.5,
               user_weight: float = 1.0, age_days: float = 0.0) -> RecallCandidate:
    return RecallCandidate(id=id, similarity=similarity, tier=tier, warmth=warmth, user_weight=user_weight,
                           refreshed_at=NOW - timedelta(days=age_days))


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


@given(threshold=st.floats(0.0, 1.0), core=st.floats(0.1, 4.0), similarity=st.floats(-1.0, 1.0))
def test_max_gate_distance_bounds_every_tier(threshold: float, core: float, similarity: float) -> None:
    if any(passes_tier_gate(similarity, threshold, tier, core) for tier in TIERS):
        assert 1.0 - similarity <= max_gate_distance(threshold, core)


def test_max_gate_distance_uses_medium_when_core_is_narrower() -> None:
    assert max_gate_distance(0.7) == pytest.approx(0.6)
    assert max_gate_distance(0.7, core_multiplier=0.5) == pytest.approx(0.3)


def test_decay_halves_every_half_life_and_ignores_the_future() -> None:
    assert decay_factor(0, 30) == 1.0
    assert decay_factor(30, 30) == pytest.approx(0.5)
    assert decay_factor(90, 30) == pytest.approx(0.125)
    assert decay_factor(-5, 30) == 1.0
    assert decay_factor(1000, 30, enabled=False) == 1.0
    with pytest.raises(ValueError, match="half_life_days"):
        decay_factor(1, 0)


def test_recall_score_multiplies_all_factors() -> None:
    score = recall_score(0.9, age_days=30, warmth=0.5, tier="core", user_weight=1.5, half_life_days=30)
    assert score == pytest.approx(0.9 * 0.5 * 1.5 * 2.0 * 1.5)
    undecayed = recall_score(0.9, age_days=30, warmth=0.5, tier="core", user_weight=1.5, half_life_days=30,
                             decay_enabled=False)
    assert undecayed == pytest.approx(2 * score)


def test_rank_candidates_gates_scores_and_orders() -> None:
    candidates = [
        _candidate("far-medium", 0.6),  # fails the medium gate at threshold 0.7
        _candidate("far-core", 0.5, tier="core"),  # passes the wider core gate
        _candidate("near-low", 0.9, tier="low"),
        _candidate("near-medium", 0.9),
        _candidate("old-medium", 0.95, age_days=60),
    ]
    ranked = rank_candidates(candidates, threshold=0.7, limit=10, now=NOW, half_life_days=30)
    # far-core 0.5×1.5×2 = 1.5 > near-medium 0.9×1.5 = 1.35 > near-low 0.675 > old-medium 0.95×0.25×1.5
    assert [m.id for m in ranked] == ["far-core", "near-medium", "near-low", "old-medium"]
    assert isinstance(ranked[0], ScoredMemory)
    assert ranked[1].score == pytest.approx(0.9 * 1.5)
    assert ranked[3].score == pytest.approx(0.95 * 0.25 * 1.5)
    assert [m.id for m in rank_candidates(candidates, threshold=0.7, limit=2, now=NOW, half_life_days=30)] == [
        "far-core", "near-medium"]
    assert rank_candidates(candidates, threshold=0.7, limit=0, now=NOW, half_life_days=30) == []


def test_rank_candidates_breaks_score_ties_by_similarity_then_id() -> None:
    # Same score: 0.8 × 2 (warmth 1) = 1.6 = 0.8 × 1 (warmth 0) × 2 (core).
    tied = [_candidate("b", 0.8, warmth=0.0, tier="core"), _candidate("a", 0.8, warmth=0.0, tier="core"),
            _candidate("c", 0.8, warmth=1.0)]
    ranked = rank_candidates(tied, threshold=0.5, limit=3, now=NOW, half_life_days=30)
    assert [m.id for m in ranked] == ["a", "b", "c"]


def test_candidates_need_timezone_aware_times_and_known_tiers() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        RecallCandidate(id="x", similarity=0.9, tier="core", warmth=0.5, user_weight=1.0,
                        refreshed_at=datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="unknown tier"):
        _candidate("x", 0.9, tier="high")


candidate_lists = st.lists(
    st.builds(
        _candidate,
        id=st.text("abcdef", min_size=1, max_size=4),
        similarity=st.sampled_from([-0.2, 0.0, 0.3, 0.4, 0.55, 0.7, 0.85, 0.9, 1.0]) | st.floats(-1.0, 1.0),
        tier=st.sampled_from(TIERS),
        warmth=st.sampled_from([0.0, 0.5, 1.0]) | st.floats(0.0, 1.0),
        user_weight=st.sampled_from([1.0, 2.0]) | st.floats(0.1, 10.0),
        age_days=st.sampled_from([0.0, 30.0]) | st.floats(-10.0, 400.0),
    ),
    max_size=30,
    unique_by=lambda c: c.id,
)


@settings(max_examples=300)
@given(candidates=candidate_lists, threshold=st.floats(0.0, 1.0), limit=st.integers(0, 8),
       decay=st.booleans(), core=st.sampled_from([0.5, 1.0, 2.0, 3.0]))
def test_rank_candidates_equals_brute_force(candidates: list[RecallCandidate], threshold: float, limit: int,
                                            decay: bool, core: float) -> None:
    expected = []
    for c in candidates:
        if 1 - c.similarity <= (1 - threshold) * {"core": core, "medium": 1.0, "low": 0.5}[c.tier] + 1e-9:
            age = max((NOW - c.refreshed_at).total_seconds() / 86400, 0.0)
            decay_value = math.exp(-math.log(2) * age / 30.0) if decay else 1.0
            score = c.similarity * decay_value * (1 + c.warmth) * TIER_GRAVITY[c.tier] * c.user_weight
            expected.append((-score, -c.similarity, c.id))
    expected.sort()
    ranked = rank_candidates(candidates, threshold=threshold, limit=limit, now=NOW, half_life_days=30.0,
                             decay_enabled=decay, core_multiplier=core)
    assert [m.id for m in ranked] == [e[2] for e in expected[:limit]]
    assert all(m.score == pytest.approx(-e[0]) for m, e in zip(ranked, expected))


@given(candidates=candidate_lists)
def test_score_upper_bound_bounds_every_less_similar_row(candidates: list[RecallCandidate]) -> None:
    max_weight = max((c.user_weight for c in candidates), default=1.0)
    ranked = rank_candidates(candidates, threshold=0.0, limit=len(candidates), now=NOW, half_life_days=30.0)
    for m in ranked:
        assert m.score <= score_upper_bound(m.similarity, max_weight) + 1e-9


def test_can_stop_fetching_needs_limit_results_that_beat_the_bound() -> None:
    strong = rank_candidates([_candidate("a", 0.95, tier="core", warmth=1.0)], threshold=0.7, limit=1,
                             now=NOW, half_life_days=30)
    # 0.95 × 2 × 2 = 3.8 beats anything at similarity 0.9 (bound 3.6) but not at 0.95 (a tie can still win).
    assert can_stop_fetching(strong, 1, last_similarity=0.9, max_user_weight=1.0)
    assert not can_stop_fetching(strong, 1, last_similarity=0.95, max_user_weight=1.0)
    assert not can_stop_fetching(strong, 2, last_similarity=0.1, max_user_weight=1.0)
    assert can_stop_fetching([], 0, last_similarity=1.0, max_user_weight=1.0)
    assert score_upper_bound(-0.3, 2.0) == 0.0


@settings(max_examples=300)
@given(candidates=candidate_lists, threshold=st.floats(0.0, 1.0), limit=st.integers(1, 6), decay=st.booleans())
def test_can_stop_fetching_never_stops_too_early(candidates: list[RecallCandidate], threshold: float, limit: int,
                                                 decay: bool) -> None:
    def rank(rows: list[RecallCandidate]) -> list[ScoredMemory]:
        return rank_candidates(rows, threshold=threshold, limit=limit, now=NOW, half_life_days=30.0,
                               decay_enabled=decay)

    # The ANN index returns rows by descending similarity; ties may come in any order.
    fetched_order = sorted(candidates, key=lambda c: -c.similarity)
    max_weight = max((c.user_weight for c in candidates), default=1.0)
    full = rank(fetched_order)
    for end in range(1, len(fetched_order) + 1):
        prefix = fetched_order[:end]
        ranked = rank(prefix)
        if can_stop_fetching(ranked, limit, prefix[-1].similarity, max_weight):
            assert [m.id for m in ranked] == [m.id for m in full]
            break
