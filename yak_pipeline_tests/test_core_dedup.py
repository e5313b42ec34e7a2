"""Near-duplicate selection, merge target, conflict scores and which pairs get a contradiction check."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from yak_pipeline.core.dedup import (
    CONFLICT_SCORE_THRESHOLD,
    NEAR_DUPLICATE_SIMILARITY,
    NEAR_DUPLICATE_TOP_K,
    Neighbour,
    choose_merge_target,
    conflict_candidates,
    is_conflict,
    select_near_duplicates,
)
from yak_pipeline.core.unit_scores import InvalidScore

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _n(id: str, similarity: float, user_id: str = "alice", status: str = "active", days: int = 0) -> Neighbour:
    return Neighbour(id=id, user_id=user_id, similarity=similarity, status=status, created_at=T0 + timedelta(days=days))


def test_constants_match_the_design() -> None:
    assert (NEAR_DUPLICATE_SIMILARITY, NEAR_DUPLICATE_TOP_K, CONFLICT_SCORE_THRESHOLD) == (0.85, 5, 0.7)


def test_near_duplicates_are_same_user_active_similar_and_not_conflicting() -> None:
    neighbours = [
        _n("new", 1.0),
        _n("bob", 0.99, user_id="bob"),
        _n("merged", 0.98, status="merged"),
        _n("review", 0.97, status="review"),
        _n("conflict", 0.96),
        _n("edge", 0.85),
        _n("below", 0.8499),
        _n("close", 0.9),
    ]
    chosen = select_near_duplicates("new", "alice", neighbours, {"conflict"})
    assert [n.id for n in chosen] == ["close", "edge"]


def test_at_most_five_near_duplicates_most_similar_first() -> None:
    neighbours = [_n(f"d{i}", 0.86 + i / 100) for i in range(8)]
    chosen = select_near_duplicates("new", "alice", neighbours, set())
    assert [n.id for n in chosen] == ["d7", "d6", "d5", "d4", "d3"]


def test_merge_target_is_the_most_similar_and_ties_go_to_the_older() -> None:
    assert choose_merge_target([]) is None
    older, newer = _n("older", 0.9, days=0), _n("newer", 0.9, days=3)
    assert choose_merge_target([_n("x", 0.88), newer, older]) == older
    assert choose_merge_target([_n("x", 0.88), _n("y", 0.95)]).id == "y"


@given(st.lists(st.builds(_n, id=st.text("abcdefgh", min_size=1, max_size=3), similarity=st.floats(-1, 1),
                          user_id=st.sampled_from(["alice", "bob"]),
                          status=st.sampled_from(["active", "review", "merged"])), max_size=20),
       st.sets(st.text("abcdefgh", min_size=1, max_size=3), max_size=4))
def test_near_duplicates_never_cross_users_or_touch_conflicts(neighbours: list[Neighbour], conflicts: set[str]) -> None:
    chosen = select_near_duplicates("a", "alice", neighbours, conflicts)
    assert len(chosen) <= 5
    assert all(n.user_id == "alice" and n.status == "active" and n.id != "a" for n in chosen)
    assert all(n.id not in conflicts and n.similarity >= 0.85 for n in chosen)
    assert [n.similarity for n in chosen] == sorted((n.similarity for n in chosen), reverse=True)
    target = choose_merge_target(chosen)
    assert target is None if not chosen else target == chosen[0]


def test_is_conflict_is_strictly_above_point_seven() -> None:
    assert is_conflict(0.71)
    assert is_conflict(1.0)
    assert not is_conflict(0.7)
    assert not is_conflict(0.0)


@pytest.mark.parametrize("bad", [math.nan, -0.1, 1.1, True, "0.9"])
def test_is_conflict_rejects_invalid_scores(bad: object) -> None:
    with pytest.raises(InvalidScore, match="conflict score"):
        is_conflict(bad)  # type: ignore[arg-type]


def test_conflict_candidates_are_same_user_active_similar_enough() -> None:
    neighbours = [_n("new", 1.0), _n("bob", 0.9, user_id="bob"), _n("review", 0.9, status="review"),
                  _n("weak", 0.49), _n("fair", 0.5), _n("strong", 0.8)]
    assert [n.id for n in conflict_candidates("new", "alice", neighbours)] == ["strong", "fair"]
    assert [n.id for n in conflict_candidates("new", "alice", neighbours, top_k=1)] == ["strong"]
    assert [n.id for n in conflict_candidates("new", "alice", neighbours, min_similarity=0.0)] == [
        "strong", "fair", "weak"]
