"""Choosing the block: only the memories near the best one (the odds gap), within a token budget."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from yak_pipeline.core.block_choice import (
    LABEL_TOKENS,
    BlockChoice,
    choose_block,
    estimated_tokens,
    fit_text,
    line_tokens,
    within_odds_gap,
)


def test_the_odds_gap_is_on_the_standings_logit_scale_whatever_the_exponent() -> None:
    # Standing odds 9, 3 and 1 (logits 2.20, 1.10, 0) under exponent 9: rank odds 9^9, 3^9, 1,
    # given as their logarithms.
    odds = [9 * math.log(9.0), 9 * math.log(3.0), 0.0]
    assert within_odds_gap(odds, exponent=9.0, odds_gap=1.2) == [True, True, False]
    assert within_odds_gap(odds, exponent=9.0, odds_gap=2.3) == [True, True, True]
    assert within_odds_gap(odds, exponent=9.0, odds_gap=0.0) == [True, False, False]
    assert within_odds_gap(odds, exponent=9.0, odds_gap=None) == [True, True, True]
    # The same standings under exponent 3 give the same answer.
    assert within_odds_gap([3 * math.log(9.0), 3 * math.log(3.0), 0.0], exponent=3.0, odds_gap=1.2) == [True, True, False]
    assert within_odds_gap([], exponent=9.0, odds_gap=1.0) == []
    # Odds past the largest float (e^800) and a memory whose odds are 0 (a superseded factor of 0).
    assert within_odds_gap([800.0, 790.0, -math.inf], exponent=9.0, odds_gap=1.2) == [True, True, False]
    assert within_odds_gap([-math.inf, -math.inf], exponent=9.0, odds_gap=1.2) == [True, True]


def test_the_budget_keeps_the_first_and_takes_what_fits_in_order() -> None:
    choice = BlockChoice(odds_gap=None, token_budget=100)
    assert choose_block([5.0, 4.0, 3.0, 2.0], [120, 60, 50, 30], exponent=1.0, choice=choice) == [0]
    assert choose_block([5.0, 4.0, 3.0, 2.0], [40, 70, 50, 10], exponent=1.0, choice=choice) == [0, 2, 3]
    assert choose_block([5.0, 4.0], [400, 400], exponent=1.0, choice=BlockChoice(odds_gap=None, token_budget=0)) == [0, 1]
    with pytest.raises(ValueError, match="one token count"):
        choose_block([1.0], [], exponent=1.0, choice=choice)
    with pytest.raises(ValueError, match="odds_gap"):
        BlockChoice(odds_gap=-1.0)


def test_superseded_memories_leave_the_block_before_the_budget_counts_them() -> None:
    choice = BlockChoice(odds_gap=None, token_budget=100)
    # The superseded first memory leaves; the budget then counts from the second.
    assert choose_block([5.0, 4.0, 3.0], [60, 60, 30], exponent=1.0, choice=choice,
                        superseded=[True, False, False]) == [1, 2]
    # None (history asked for): the superseded memory stays.
    assert choose_block([5.0, 4.0, 3.0], [60, 60, 30], exponent=1.0, choice=choice, superseded=None) == [0, 2]
    with pytest.raises(ValueError, match="superseded flag"):
        choose_block([5.0, 4.0], [1, 1], exponent=1.0, choice=choice, superseded=[False])
    assert line_tokens("x" * 40) == 10 + LABEL_TOKENS


def test_a_long_text_is_cut_at_a_word_to_its_budget() -> None:
    text = "word " * 100
    cut = fit_text(text, 10)
    assert cut.endswith("…") and len(cut) <= 40 and not cut[:-1].endswith(" wor")
    assert fit_text("short", 10) == "short" and fit_text(text, 0) == text
    assert estimated_tokens("") == 1 and estimated_tokens("x" * 9) == 3


@given(st.lists(st.floats(-1000.0, 1000.0), min_size=1, max_size=20), st.floats(0.0, 10.0))
def test_the_best_memory_always_joins_and_the_block_is_a_prefix_of_recalls_order(odds: list[float], gap: float) -> None:
    near = within_odds_gap(odds, exponent=9.0, odds_gap=gap)
    assert near[odds.index(max(odds))]
    # A prefix: once a memory is out, every one below it is out.
    assert near == sorted(near, reverse=True)
    for value, kept in zip(odds, near):
        within = max(odds) - value <= gap * 9.0 + 1e-9
        # A memory within the gap always joins; one outside it only above one within it.
        assert kept or not within


def test_a_memory_recall_moved_up_stays_above_the_one_that_joins() -> None:
    # The current fact (odds 3^9) placed above the statement it replaced (9^9): it joins with it,
    # though on its own odds it is outside the gap; the unrelated memory below stays out.
    assert within_odds_gap([9 * math.log(3.0), 9 * math.log(9.0), 0.0], exponent=9.0, odds_gap=0.5) == [True, True, False]
