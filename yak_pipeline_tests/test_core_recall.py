"""The pure recall ranking (core.recall) and the calibrated relevance model (core.relevance)."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from yak_pipeline.core.query_intent import asks_about_present
from yak_pipeline.core.recall import (
    PRESENT_WINDOW,
    UPDATE_WINDOW,
    Candidate,
    RankedMemory,
    RecallParams,
    rank_memories,
    readable_score,
)
from yak_pipeline.core.relevance import (
    FEATURES,
    NON_NEGATIVE_FEATURES,
    RelevanceModel,
    RelevanceSignals,
    answerable_features,
    relevance_features,
    speaks_of_self,
)
from yak_pipeline.core.scoring import TIER_GRAVITY
from yak_pipeline.core.types import TIERS
from yak_pipeline.core.updates import announces_update, tells_of_change
from yak_pipeline.recall_models import load_relevance_model

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
# relevance = sigmoid(10 × cos_distillation): a candidate's relevance is set through its cosine.
STEEP = RelevanceModel(embedding_model="test", version="test@1", bias=0.0, weights={"cos_distillation": 10.0})


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def _odds(p: float) -> float:
    return p / (1 - p)


def _signals(cos: float = 0.5, *, cos_x: float | None = None, bm25_d: float = 0.0, bm25_x: float = 0.0,
             best_cos: float | None = None, best_cos_x: float | None = None, best_bm25_d: float = 0.0,
             best_bm25_x: float = 0.0, raw: bool = False) -> RelevanceSignals:
    return RelevanceSignals(cos_distillation=cos, cos_exchange=cos_x, bm25_distillation=bm25_d, bm25_exchange=bm25_x,
                            best_cos_distillation=cos if best_cos is None else best_cos, best_cos_exchange=best_cos_x,
                            best_bm25_distillation=best_bm25_d, best_bm25_exchange=best_bm25_x, raw=raw)


def _candidate(id: str, *, relevance: float | None = None, tier: str = "medium", warmth: float = 0.0,
               user_weight: float = 1.0, age_days: float = 0.0, superseded_by: str | None = None,
               signals: RelevanceSignals | None = None, words: str = "") -> Candidate:
    """A candidate; ``relevance`` (under :data:`STEEP`) is set through the distillation cosine."""
    if signals is None:
        signals = _signals(_logit(relevance) / 10.0 if relevance is not None else 0.5)
    return Candidate(id=id, tier=tier, warmth=warmth, user_weight=user_weight,  # type: ignore[arg-type]
                     refreshed_at=NOW - timedelta(days=age_days), signals=signals,
                     ranks={"distillation_vector": 1}, superseded_by=superseded_by, words=words)


def _constant(relevance: float) -> RelevanceModel:
    """A model giving every candidate the same relevance (no feature weighed)."""
    return RelevanceModel(embedding_model="test", version="const", bias=_logit(relevance), weights={})


# --- the gate -------------------------------------------------------------------------------------


def test_relevance_one_half_passes_the_core_gate_and_fails_medium_and_low_at_t_0_7() -> None:
    candidates = [_candidate("c", tier="core"), _candidate("m", tier="medium"), _candidate("l", tier="low")]
    half = RelevanceModel(embedding_model="test", version="half", bias=0.0, weights={})
    ranked = rank_memories(candidates, model=half, params=RecallParams(threshold=0.7), now=NOW)
    assert [r.id for r in ranked] == ["c"]
    assert ranked[0].relevance == pytest.approx(0.5)
    # Without the gate every candidate is ranked (diagnostics, ablations).
    ungated = rank_memories(candidates, model=half, params=RecallParams(threshold=0.7, gate=False), now=NOW)
    assert {r.id for r in ungated} == {"c", "m", "l"}


@pytest.mark.parametrize(("relevance", "passing"), [
    (0.39, set()), (0.41, {"c"}), (0.71, {"c", "m"}), (0.84, {"c", "m"}), (0.86, {"c", "m", "l"})])
def test_each_tier_has_its_own_relevance_bar(relevance: float, passing: set[str]) -> None:
    # t = 0.7: core needs relevance >= 0.4, medium >= 0.7, low >= 0.85.
    candidates = [_candidate("c", tier="core"), _candidate("m", tier="medium"), _candidate("l", tier="low")]
    ranked = rank_memories(candidates, model=_constant(relevance), params=RecallParams(threshold=0.7), now=NOW)
    assert {r.id for r in ranked} == passing


def test_the_core_multiplier_widens_only_the_core_gate() -> None:
    candidates = [_candidate("c", tier="core"), _candidate("m", tier="medium")]
    params = RecallParams(threshold=0.7, core_multiplier=3.0)  # core needs relevance >= 0.1
    assert [r.id for r in rank_memories(candidates, model=_constant(0.15), params=params, now=NOW)] == ["c"]
    assert rank_memories(candidates, model=_constant(0.15), params=RecallParams(threshold=0.7), now=NOW) == []


def test_nothing_relevant_means_nothing_is_recalled() -> None:
    candidates = [_candidate(str(i), tier=tier, warmth=1.0, user_weight=10.0) for i, tier in enumerate(TIERS)]
    # However warm and weighty, memories that do not answer the query are not recalled.
    assert rank_memories(candidates, model=_constant(0.2), params=RecallParams(threshold=0.7), now=NOW) == []
    assert rank_memories([], model=STEEP, params=RecallParams(), now=NOW) == []


# --- the score and the order ----------------------------------------------------------------------


def test_the_score_multiplies_the_odds_to_the_exponent_decay_warmth_gravity_and_supersession() -> None:
    params = RecallParams(threshold=0.0, half_life_days=30.0, relevance_exponent=6.0, superseded_factor=0.5)
    c = _candidate("x", relevance=0.9, tier="core", warmth=0.5, user_weight=1.5, age_days=30, superseded_by="y")
    [r] = rank_memories([c], model=STEEP, params=params, now=NOW)
    assert isinstance(r, RankedMemory)
    assert r.relevance == pytest.approx(0.9)
    assert r.decay == pytest.approx(0.5)
    assert r.gravity == pytest.approx(TIER_GRAVITY["core"] * 1.5)
    assert r.rank_odds == pytest.approx(_odds(0.9) ** 6 * 0.5 * 1.5 * 3.0 * 0.5)
    undecayed = rank_memories([c], model=STEEP, params=RecallParams(threshold=0.0, decay_enabled=False), now=NOW)
    assert undecayed[0].decay == 1.0


def test_the_relevance_exponent_lets_relevance_outweigh_the_priors() -> None:
    # "top" answers better (0.75, odds 3) but is a month old (decay 0.5); "fresh" merely passes
    # (0.7, odds 7/3), today.
    top = _candidate("top", relevance=0.75, age_days=30)
    fresh = _candidate("fresh", relevance=0.7)
    linear = rank_memories([top, fresh], model=STEEP, params=RecallParams(relevance_exponent=1.0), now=NOW)
    assert [r.id for r in linear] == ["fresh", "top"]  # 7/3 > 3 × 0.5
    steep = rank_memories([top, fresh], model=STEEP, params=RecallParams(relevance_exponent=10.0), now=NOW)
    assert [r.id for r in steep] == ["top", "fresh"]  # 3^10 × 0.5 > (7/3)^10
    assert steep[0].rank_odds / steep[1].rank_odds == pytest.approx((3 / (7 / 3)) ** 10 * 0.5)


def test_a_certain_memory_has_finite_rank_odds() -> None:
    certain = RelevanceModel(embedding_model="test", version="sure", bias=100.0, weights={})
    [r] = rank_memories([_candidate("x")], model=certain, params=RecallParams(relevance_exponent=20.0), now=NOW)
    assert r.relevance == 1.0 and math.isfinite(r.rank_odds)


def test_odds_past_the_largest_float_still_rank_in_order_and_never_overflow() -> None:
    # Logits 12 and 11 under exponent 100: rank odds e^1200 and e^1100, past the largest float.
    # Computed as a product this raised OverflowError (YAK_RECALL_RELEVANCE_EXPONENT allows 100).
    steep = RelevanceModel(embedding_model="test", version="steep", bias=0.0, weights={"cos_distillation": 20.0})
    pair = [_candidate("b", signals=_signals(0.55)), _candidate("a", signals=_signals(0.6))]
    params = RecallParams(threshold=0.0, relevance_exponent=100.0)
    ranked = rank_memories(pair, model=steep, params=params, now=NOW)
    assert [r.id for r in ranked] == ["a", "b"]
    assert [r.log_rank_odds for r in ranked] == pytest.approx([1200.0, 1100.0])
    assert all(math.isfinite(r.rank_odds) and r.rank_odds == pytest.approx(sys.float_info.max) for r in ranked)
    assert [r.score for r in ranked] == pytest.approx([1 / (1 + math.exp(-12)), 1 / (1 + math.exp(-11))])
    # Decay over a thousand half-lives (the factor underflows to 0) still orders by age.
    old = [_candidate("new", relevance=0.8, age_days=40_000), _candidate("old", relevance=0.8, age_days=50_000)]
    ranked = rank_memories(old, model=STEEP, params=RecallParams(threshold=0.0, half_life_days=30.0), now=NOW)
    assert [r.id for r in ranked] == ["new", "old"] and ranked[0].decay == 0.0
    assert ranked[0].log_rank_odds > ranked[1].log_rank_odds > -math.inf


def test_a_superseded_memory_ranks_below_the_one_that_replaced_it_at_equal_relevance() -> None:
    # Same relevance, age, tier and warmth; the old one would win the id tie-break.
    old = _candidate("a-old", relevance=0.8, superseded_by="b-new")
    new = _candidate("b-new", relevance=0.8)
    ranked = rank_memories([old, new], model=STEEP, params=RecallParams(), now=NOW)
    assert [r.id for r in ranked] == ["b-new", "a-old"]
    assert ranked[1].rank_odds == pytest.approx(0.5 * ranked[0].rank_odds)
    assert ranked[1].superseded_by == "b-new" and ranked[0].superseded_by is None
    # Still recalled (a question about the past may need it); with factor 1 the id would decide,
    # but an outdated fact never leads the one that replaced it.
    even = rank_memories([old, new], model=STEEP, params=RecallParams(superseded_factor=1.0), now=NOW)
    assert [r.id for r in even] == ["b-new", "a-old"] and even[0].rank_odds == even[1].rank_odds


def test_ties_break_by_relevance_then_id_and_the_limit_keeps_the_best() -> None:
    # Equal scores: core gravity 2 × odds(0.8) against medium 1 × (1 + warmth 1) × odds(0.8).
    params = RecallParams(threshold=0.0, relevance_exponent=1.0, limit=3)
    tied = [_candidate("b", relevance=0.8, tier="core"), _candidate("a", relevance=0.8, tier="core"),
            _candidate("c", relevance=0.8, warmth=1.0)]
    assert [r.id for r in rank_memories(tied, model=STEEP, params=params, now=NOW)] == ["a", "b", "c"]
    # Equal score, different relevance: odds(0.5) = 1 = odds(0.2) × 2 (core) × 2 (warmth 1):
    # the more relevant first.
    pair = [_candidate("z", relevance=0.5), _candidate("y", relevance=0.2, tier="core", warmth=1.0)]
    assert len({r.rank_odds for r in rank_memories(pair, model=STEEP, params=params, now=NOW)}) == 1
    assert [r.id for r in rank_memories(pair, model=STEEP, params=params, now=NOW)] == ["z", "y"]
    many = [_candidate(f"m{i}", relevance=0.5 + i / 100) for i in range(10)]
    top = rank_memories(many, model=STEEP, params=RecallParams(threshold=0.0, limit=3), now=NOW)
    assert [r.id for r in top] == ["m9", "m8", "m7"]
    assert rank_memories(many, model=STEEP, params=RecallParams(threshold=0.0, limit=0), now=NOW) == []


def test_a_question_about_the_present_gets_the_block_newest_first_and_the_rest_by_score() -> None:
    # Seven answers, the most relevant the oldest: "old" said 200 days ago, "new" 5 days ago.
    candidates = [_candidate(f"m{i}", relevance=0.99 - i * 0.01, age_days=age)
                  for i, age in enumerate([200, 150, 5, 90, 40, 1, 300])]
    params = RecallParams(threshold=0.0, limit=7, decay_enabled=False)
    by_score = rank_memories(candidates, model=STEEP, params=params, now=NOW)
    assert [m.id for m in by_score] == ["m0", "m1", "m2", "m3", "m4", "m5", "m6"]
    assert not any(m.newest_first for m in by_score)
    present = rank_memories(candidates, model=STEEP, params=params, now=NOW, about_present=True)
    # The best PRESENT_WINDOW (5) by score are reordered by recency; the rest keep the score's order.
    assert PRESENT_WINDOW == 5
    assert [m.id for m in present] == ["m2", "m4", "m3", "m1", "m0", "m5", "m6"]
    assert [m.newest_first for m in present] == [True] * 5 + [False] * 2
    assert present[0].explain()["newest_first"] is True
    # Which memories are recalled is relevance's choice alone; recency only orders them.
    assert {m.id for m in present} == {m.id for m in by_score}
    assert [m.id for m in rank_memories(candidates, model=STEEP, params=replace(params, limit=2), now=NOW,
                                        about_present=True)] == ["m1", "m0"]


def test_questions_about_the_present_are_read_from_their_words() -> None:
    for question in ("Which town do I live in now?", "Who's my current partner?", "What do I drink these days?",
                     "Do I still play bass?", "Where do I work at the moment?", "Is she vegan anymore?",
                     "What is my latest test score?", "How many interviews have I had in the recent period?"):
        assert asks_about_present(question), question
    for question in ("Where did I grow up?", "When did I move to Porto?", "How long have I had my current job?",
                     "What year did I start at the current school?", "What is my dog called?",
                     "When did I recently move?"):
        assert not asks_about_present(question), question


def test_a_memory_announcing_a_new_value_moves_ahead_of_older_ones_near_the_top() -> None:
    # The older statement ranks first by score; the newer one says the value changed.
    candidates = [
        _candidate("old", relevance=0.99, age_days=30, words="User's repository has 150 commits on main."),
        _candidate("other", relevance=0.98, age_days=40, words="User tagged release v1.0.0."),
        _candidate("new", relevance=0.97, age_days=3,
                   words="The commits merged into the main branch have now reached 165."),
        _candidate("far", relevance=0.96, age_days=1, words="User's coverage recently improved to 78%."),
    ]
    params = RecallParams(threshold=0.0, limit=4, decay_enabled=False)
    ranked = rank_memories(candidates, model=STEEP, params=params, now=NOW)
    assert UPDATE_WINDOW == 3
    # "new" moves above both older memories; "far" (4th) is outside the window and stays.
    assert [m.id for m in ranked] == ["new", "old", "other", "far"]
    assert [m.update_first for m in ranked] == [True, False, False, False]
    assert ranked[0].explain(NOW)["update_first"] is True
    assert "put ahead of older memories: it says the value changed" in ranked[0].reasons(NOW)
    # A question about the past wants the old value: the score's order stands; so with the reading off.
    assert [m.id for m in rank_memories(candidates, model=STEEP, params=params, now=NOW, about_past=True)] == [
        "old", "other", "new", "far"]
    assert [m.id for m in rank_memories(candidates, model=STEEP, params=replace(params, updates_first=False),
                                        now=NOW)] == ["old", "other", "new", "far"]


def test_an_update_never_moves_above_a_newer_memory_or_another_update() -> None:
    candidates = [
        _candidate("newer", relevance=0.99, age_days=1, words="User likes tea."),
        _candidate("also", relevance=0.98, age_days=50, words="The deadline has now moved to May."),
        _candidate("update", relevance=0.97, age_days=5, words="The new deadline is June 2."),
    ]
    ranked = rank_memories(candidates, model=STEEP, params=RecallParams(threshold=0.0, limit=3, decay_enabled=False),
                           now=NOW)
    assert [m.id for m in ranked] == ["newer", "also", "update"]
    assert not any(m.update_first for m in ranked)


def test_a_new_value_is_read_from_the_words_that_announce_it() -> None:
    for text in ("the number of commits has now reached 165", "my coverage recently improved to 78%",
                 "I need to meet the new deadline of April 5", "the quota was increased to 1,200 calls",
                 "the mentees I've worked with has increased to 7", "my weekly target was updated to 1,350 words",
                 "the new sprint deadline of April 5", "I won't meet the new April 25 deadline",
                 "remind me that it's rescheduled to March 22 at 4:30 PM", "the launch was postponed a week",
                 "the review is at 4 instead of 3"):
        assert announces_update(text), text
    for text in ("I have 150 commits on main", "I want to improve my test coverage", "I moved the chair",
                 "a new idea for the app", "what is the deadline?",
                 "I'm new to this", "a new friend from the time I lived in Rome", "can we meet at 3?"):
        assert not announces_update(text), text


def test_a_change_or_how_things_stand_now_is_read_from_the_words() -> None:
    for text in ("User drives a Subaru Forester now.", "User has stopped drinking completely.",
                 "User no longer eats meat.", "User switched to oat milk.", "User doesn't smoke any more.",
                 "User quit padel.", "User is currently learning Portuguese.", "User started eating fish again."):
        assert tells_of_change(text), text
    for text in ("User lives in Ruzafa.", "User's sister Chioma had a baby boy.", "User is vegetarian.",
                 "User knows the station well.", "User's flatmate is Irene."):
        assert not tells_of_change(text), text


def test_a_memory_telling_of_a_change_is_marked_for_a_question_about_the_present() -> None:
    """``present_change`` is 1 when the signals say so (``store.recall`` sets it only for a question
    about the present and a distillation's words); a model without its weight ignores it."""
    plain = _signals(0.5)
    assert relevance_features(plain)["present_change"] == 0.0
    assert relevance_features(replace(plain, present_change=True))["present_change"] == 1.0
    assert STEEP.logit(relevance_features(replace(plain, present_change=True))) == STEEP.logit(relevance_features(plain))
    shipped = load_relevance_model("all-MiniLM-L6-v2")
    lifted = shipped.logit(relevance_features(replace(plain, present_change=True)))
    assert lifted > shipped.logit(relevance_features(plain))  # the shipped fit weighs it as evidence for


def test_explain_carries_every_factor_of_the_score() -> None:
    signals = _signals(0.2, cos_x=0.3, bm25_d=2.0, bm25_x=4.0, best_cos=0.4, best_cos_x=0.5, best_bm25_d=4.0,
                       best_bm25_x=4.0)
    c = Candidate(id="x", tier="core", warmth=0.25, user_weight=2.0, refreshed_at=NOW - timedelta(days=15),
                  signals=signals, ranks={"exchange_text": 1, "distillation_vector": 3}, superseded_by="n")
    [r] = rank_memories([c], model=STEEP, params=RecallParams(threshold=0.0, relevance_exponent=6.0), now=NOW)
    explained = r.explain()
    assert explained["relevance"] == r.relevance == pytest.approx(1 / (1 + math.exp(-2.0)))
    assert explained["decay"] == pytest.approx(2 ** -0.5)
    assert explained["warmth_factor"] == pytest.approx(1.25)
    assert explained["gravity"] == pytest.approx(4.0)
    assert explained["superseded_by"] == "n"
    assert explained["rank_odds"] == pytest.approx(_odds(r.standing) ** 6 * 2 ** -0.5 * 1.25 * 4.0 * 0.5)
    legs = explained["legs"]
    assert legs["ranks"] == {"exchange_text": 1, "distillation_vector": 3}  # type: ignore[index]
    assert legs["features"] == relevance_features(signals)  # type: ignore[index]
    assert r.similarity == pytest.approx(0.3)  # the better of the two cosines


def test_the_shown_score_is_in_0_1_keeps_the_order_and_is_the_relevance_with_neutral_priors() -> None:
    """The internal odds span orders of magnitude (1e29 was printed as a score); the shown score is
    the same order on the relevance scale."""
    candidates = [Candidate(id=f"m{i}", tier=tier, warmth=warmth, user_weight=weight,
                            refreshed_at=NOW - timedelta(days=days), signals=_signals(cos))
                  for i, (cos, tier, warmth, weight, days) in enumerate(
                      [(0.9, "core", 1.0, 3.0, 0), (0.8, "medium", 0.5, 1.0, 40), (0.3, "low", 0.0, 0.5, 400),
                       (0.95, "medium", 0.0, 1.0, 0)])]
    ranked = rank_memories(candidates, model=STEEP, params=RecallParams(threshold=0.0, limit=10, gate=False), now=NOW)
    assert all(0.0 <= r.score <= 1.0 for r in ranked)
    assert [r.score for r in ranked] == sorted((r.score for r in ranked), reverse=True)
    assert max(r.rank_odds for r in ranked) > 1e6  # what used to be shown
    [neutral] = rank_memories([Candidate(id="n", tier="medium", warmth=0.0, user_weight=1.0, refreshed_at=NOW,
                                         signals=_signals(0.6))],
                              model=STEEP, params=RecallParams(threshold=0.0, decay_enabled=False), now=NOW)
    assert neutral.score == pytest.approx(neutral.relevance)
    assert readable_score(-math.inf, 1.0, 9.0) == 0.0 and readable_score(math.inf, 0.8, 9.0) == 0.8
    assert readable_score(0.0, 1.0, 9.0) == 0.5  # rank odds 1


def test_reasons_say_in_plain_words_why_a_memory_ranked() -> None:
    c = Candidate(id="x", tier="core", warmth=0.9, user_weight=2.0, refreshed_at=NOW - timedelta(days=45),
                  signals=_signals(0.8, cos_x=0.7, bm25_x=4.0, best_cos=0.8, best_bm25_x=4.0), superseded_by="n")
    [r] = rank_memories([c], model=STEEP, params=RecallParams(threshold=0.0), now=NOW)
    why = r.reasons(NOW)
    assert why[0] == "a distilled memory"
    assert "the closest in meaning of all your memories (similarity 0.80)" in why
    assert "shares the most words with the question" in why
    assert "said 45 days ago, so it counts for less" in why
    assert {"it helped in earlier answers", "pinned by you (weight 2)", "a core memory: counts double",
            "a newer memory replaced it"} <= set(why)
    assert r.explain(NOW)["why"] == why
    raw = Candidate(id="r", tier="medium", warmth=0.5, user_weight=1.0, refreshed_at=NOW,
                    signals=_signals(0.5, best_cos=0.8, raw=True), kind="raw")
    [r] = rank_memories([raw], model=STEEP, params=RecallParams(threshold=0.0), now=NOW)
    assert r.reasons(NOW)[:3] == ["what you said yourself (no distilled memory stands for it yet)",
                                  "close in meaning (similarity 0.50)", "said today"]
    # Words that say nothing about the user (no first-person word) are told apart.
    plain = replace(raw, signals=replace(raw.signals, about_self=False))
    [r] = rank_memories([plain], model=STEEP, params=RecallParams(threshold=0.0), now=NOW)
    assert r.reasons(NOW)[1] == "it says nothing about you (no I, me or my), so it counts for less"


def test_a_superseded_memory_never_ranks_above_the_memory_that_replaced_it() -> None:
    """Even when its relevance is far higher (the old statement shares the question's words)."""
    old = _candidate("old", relevance=0.99, superseded_by="new")
    older = _candidate("older", relevance=0.995, superseded_by="old")  # a chain: older -> old -> new
    new = _candidate("new", relevance=0.6)
    other = _candidate("other", relevance=0.7)
    ranked = rank_memories([older, old, new, other], model=STEEP, params=RecallParams(threshold=0.0, limit=10),
                           now=NOW)
    assert [m.id for m in ranked] == ["other", "new", "old", "older"]
    # The replacing memory not among the candidates: the superseded one keeps its place.
    alone = rank_memories([old, other], model=STEEP, params=RecallParams(threshold=0.0, limit=10), now=NOW)
    assert [m.id for m in alone] == ["old", "other"]


def test_params_candidates_and_now_are_validated() -> None:
    for bad in ({"threshold": 1.5}, {"threshold": -0.1}, {"limit": -1}, {"relevance_exponent": 0},
                {"relevance_exponent": math.inf}, {"superseded_factor": 1.5}, {"leg_size": 0}):
        with pytest.raises(ValueError):
            RecallParams(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timezone-aware"):
        Candidate(id="x", tier="core", warmth=0.0, user_weight=1.0, refreshed_at=datetime(2026, 1, 1),
                  signals=_signals())
    with pytest.raises(ValueError, match="unknown tier"):
        _candidate("x", tier="high")
    with pytest.raises(ValueError, match="timezone-aware"):
        rank_memories([], model=STEEP, params=RecallParams(), now=NOW.replace(tzinfo=None))


candidate_lists = st.lists(
    st.builds(
        _candidate,
        id=st.text("abcdef", min_size=1, max_size=4),
        relevance=st.sampled_from([0.3, 0.4, 0.5, 0.7, 0.85, 0.9]) | st.floats(0.01, 0.99),
        tier=st.sampled_from(TIERS),
        warmth=st.sampled_from([0.0, 0.5, 1.0]) | st.floats(0.0, 1.0),
        user_weight=st.sampled_from([1.0, 2.0]) | st.floats(0.1, 10.0),
        age_days=st.sampled_from([0.0, 30.0]) | st.floats(-10.0, 400.0),
        superseded_by=st.none() | st.just("newer"),
    ),
    max_size=30,
    unique_by=lambda c: c.id,
)


@settings(max_examples=200)
@given(candidates=candidate_lists, threshold=st.floats(0.0, 1.0), limit=st.integers(0, 8), decay=st.booleans(),
       core=st.sampled_from([0.5, 1.0, 2.0, 3.0]), exponent=st.sampled_from([1.0, 2.5, 6.0]),
       superseded=st.sampled_from([0.0, 0.5, 1.0]))
def test_rank_memories_equals_brute_force(candidates: list[Candidate], threshold: float, limit: int, decay: bool,
                                          core: float, exponent: float, superseded: float) -> None:
    params = RecallParams(threshold=threshold, limit=limit, decay_enabled=decay, core_multiplier=core,
                          relevance_exponent=exponent, superseded_factor=superseded)
    expected = []
    for c in candidates:
        relevance = 1 / (1 + math.exp(-10.0 * c.signals.cos_distillation))
        if 1 - relevance > (1 - threshold) * {"core": core, "medium": 1.0, "low": 0.5}[c.tier] + 1e-9:
            continue
        age = max((NOW - c.refreshed_at).total_seconds() / 86400, 0.0)
        decay_value = math.exp(-math.log(2) * age / 30.0) if decay else 1.0
        score = (_odds(relevance) ** exponent * decay_value * (1 + c.warmth) * TIER_GRAVITY[c.tier] * c.user_weight
                 * (superseded if c.superseded_by else 1.0))
        expected.append((-score, -relevance, c.id))
    expected.sort()
    ranked = rank_memories(candidates, model=STEEP, params=params, now=NOW)
    assert [m.id for m in ranked] == [e[2] for e in expected[:limit]]
    assert all(m.rank_odds == pytest.approx(-e[0]) for m, e in zip(ranked, expected))


# --- relevance features ---------------------------------------------------------------------------


def test_a_raw_exchange_that_says_nothing_of_the_user_is_marked() -> None:
    """``raw_not_about_self`` is 1 only for a raw exchange whose user side has no first-person word."""
    assert speaks_of_self("And something for my niece Greta, she's three.")
    assert speaks_of_self("I'm off to Lisbon") and speaks_of_self("Tell me more")
    assert not speaks_of_self("Can you make a moving checklist?") and not speaks_of_self("Wow, nice!")
    assert not speaks_of_self("Imagine that, a minefield in Iceland!")  # words that only contain "i", "mine"
    plain = RelevanceSignals(cos_distillation=0.5, cos_exchange=0.5, bm25_distillation=0.0, bm25_exchange=0.0,
                             best_cos_distillation=0.5, best_cos_exchange=0.5, best_bm25_distillation=0.0,
                             best_bm25_exchange=0.0, raw=True, about_self=False)
    assert relevance_features(plain)["raw_not_about_self"] == 1.0
    assert relevance_features(replace(plain, about_self=True))["raw_not_about_self"] == 0.0
    # A distillation is always about its user, whatever the flag says.
    assert relevance_features(replace(plain, raw=False))["raw_not_about_self"] == 0.0


def test_a_memory_holding_what_the_question_asks_for_is_marked() -> None:
    """``answer_kind`` is 1 when the signals say the memory holds the kind of thing the query asks for."""
    plain = _signals(0.5)
    assert relevance_features(plain)["answer_kind"] == 0.0
    assert relevance_features(replace(plain, answer_kind=True))["answer_kind"] == 1.0
    # A model fitted before the feature existed has no weight for it and ignores it.
    assert STEEP.logit(relevance_features(replace(plain, answer_kind=True))) == STEEP.logit(relevance_features(plain))


def test_features_are_cosines_gaps_to_the_best_and_bm25_relative_to_the_best() -> None:
    features = relevance_features(_signals(0.6, cos_x=0.5, bm25_d=3.0, bm25_x=1.0, best_cos=0.8, best_cos_x=0.9,
                                           best_bm25_d=6.0, best_bm25_x=5.0))
    assert set(features) == set(FEATURES)
    # No context vectors: the context features read the exchange's (the best stand-in). The
    # exchange's BM25 ratio (1/5) counts at the query's lexical strength, here one half (best = 5).
    assert features == pytest.approx({"cos_distillation": 0.6, "cos_exchange": 0.5, "cos_context": 0.5,
                                      "gap_distillation": -0.2, "gap_exchange": -0.4, "gap_context": -0.4,
                                      "text_distillation": 0.5, "text_exchange": 0.1, "raw_exchange": 0.0,
                                      "lexical_strength": 0.5, "raw_not_about_self": 0.0, "answer_kind": 0.0,
                                      "present_change": 0.0})
    # A query whose best lexical match is a common word or two: its shared words count for little.
    weak = relevance_features(_signals(0.6, bm25_x=2.0, best_bm25_x=2.0))
    strong = relevance_features(_signals(0.6, bm25_x=12.0, best_bm25_x=12.0))
    assert weak["text_exchange"] < 0.05 < 0.99 < strong["text_exchange"]
    # The best memory of a leg has gap 0 and text ratio 1; a leg nobody matched gives 0.
    best = relevance_features(_signals(0.8, cos_x=0.9, bm25_d=6.0, best_cos=0.8, best_cos_x=0.9, best_bm25_d=6.0))
    assert best["gap_distillation"] == 0.0 and best["gap_exchange"] == 0.0
    assert best["text_distillation"] == 1.0 and best["text_exchange"] == 0.0


def test_a_missing_exchange_cosine_falls_back_to_the_distillations() -> None:
    # The exchange has no vector of the active model yet: its cosine is the distillation's.
    features = relevance_features(_signals(0.6, cos_x=None, best_cos=0.7, best_cos_x=None))
    assert features["cos_exchange"] == 0.6
    assert features["gap_exchange"] == pytest.approx(-0.1) == features["gap_distillation"]
    # Other memories' exchanges do have vectors: the gap is to their best.
    mixed = relevance_features(_signals(0.6, cos_x=None, best_cos=0.7, best_cos_x=0.9))
    assert mixed["cos_exchange"] == 0.6 and mixed["gap_exchange"] == pytest.approx(-0.3)


def test_context_features_are_the_cosine_in_context_and_its_gap_to_the_best() -> None:
    signals = RelevanceSignals(0.6, 0.5, 0.0, 0.0, 0.8, 0.9, 0.0, 0.0, cos_context=0.55, best_cos_context=0.75)
    features = relevance_features(signals)
    assert features["cos_context"] == 0.55 and features["gap_context"] == pytest.approx(-0.2)
    # The best context of the query is the answerability's third input.
    assert answerable_features(signals)["best_cos_context"] == 0.75
    # Some memories have context vectors, this one not yet: it reads its exchange's cosine.
    pending = relevance_features(RelevanceSignals(0.6, 0.5, 0.0, 0.0, 0.8, 0.9, 0.0, 0.0, None, 0.75))
    assert pending["cos_context"] == 0.5 and pending["gap_context"] == pytest.approx(-0.25)


finite = st.floats(-1e6, 1e6, allow_nan=False)
cosine = st.floats(-1.0, 1.0)
bm25 = st.floats(0.0, 50.0) | st.just(0.0)


@given(cos=cosine, cos_x=st.none() | cosine, best=cosine, best_x=st.none() | cosine, bm25_d=bm25, bm25_x=bm25,
       best_bm25_d=bm25, best_bm25_x=bm25)
def test_gaps_are_never_positive_and_text_ratios_stay_in_the_unit_interval(
        cos: float, cos_x: float | None, best: float, best_x: float | None, bm25_d: float, bm25_x: float,
        best_bm25_d: float, best_bm25_x: float) -> None:
    # Even inconsistent inputs (a "best" below the value, as float noise can make) stay in range.
    features = relevance_features(RelevanceSignals(cos, cos_x, bm25_d, bm25_x, best, best_x, best_bm25_d, best_bm25_x))
    assert features["gap_distillation"] <= 0.0 and features["gap_exchange"] <= 0.0 and features["gap_context"] <= 0.0
    assert 0.0 <= features["text_distillation"] <= 1.0 and 0.0 <= features["text_exchange"] <= 1.0
    assert all(math.isfinite(v) for v in features.values())


# --- the relevance model --------------------------------------------------------------------------


def test_relevance_is_the_sigmoid_of_the_weighted_features() -> None:
    model = RelevanceModel(embedding_model="m", version="v", bias=-1.0,
                           weights={"cos_distillation": 2.0, "gap_exchange": 3.0, "text_exchange": 1.5})
    signals = _signals(0.5, cos_x=0.4, bm25_x=2.0, best_cos_x=0.6, best_bm25_x=4.0)
    # The exchange's BM25 ratio (0.5) scaled by the query's lexical strength, sigmoid(4 - 5).
    logit = -1.0 + 2.0 * 0.5 + 3.0 * (0.4 - 0.6) + 1.5 * 0.5 / (1 + math.exp(1.0))
    assert model.logit(relevance_features(signals)) == pytest.approx(logit)
    assert model.relevance(signals) == pytest.approx(1 / (1 + math.exp(-logit)))
    # Extreme logits neither overflow nor leave [0, 1].
    assert RelevanceModel(embedding_model="m", version="v", bias=-1e4, weights={}).relevance(signals) == 0.0
    assert RelevanceModel(embedding_model="m", version="v", bias=1e4, weights={}).relevance(signals) == 1.0


@pytest.mark.parametrize("feature", sorted(NON_NEGATIVE_FEATURES))
def test_a_negative_lexical_weight_is_refused(feature: str) -> None:
    with pytest.raises(ValueError, match=f"weight of {feature} must be >= 0"):
        RelevanceModel(embedding_model="m", version="v", bias=0.0, weights={feature: -0.1})
    # Semantic features may weigh either way (the hashing embedder's fit has a negative cosine weight).
    RelevanceModel(embedding_model="m", version="v", bias=0.0, weights={"cos_distillation": -0.7, feature: 0.0})


def test_unknown_features_and_non_finite_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown features"):
        RelevanceModel(embedding_model="m", version="v", bias=0.0, weights={"rrf": 1.0})
    with pytest.raises(ValueError, match="finite"):
        RelevanceModel(embedding_model="m", version="v", bias=math.nan, weights={})
    with pytest.raises(ValueError, match="finite"):
        RelevanceModel(embedding_model="m", version="v", bias=0.0, weights={"cos_exchange": math.inf})


def test_the_json_form_round_trips_and_malformed_files_are_named() -> None:
    model = RelevanceModel(embedding_model="feature-hashing-384", version="v@1", bias=-0.25,
                           weights={name: 0.5 for name in FEATURES}, fitted_on={"files": {"dev.json": {"n": 3}}})
    data = model.to_dict()
    assert RelevanceModel.from_dict(data) == model
    assert RelevanceModel.from_dict(data).to_dict() == data
    assert RelevanceModel.from_dict({**data, "fitted_on": None}).fitted_on == {}
    missing = {k: v for k, v in data.items() if k != "bias"}
    with pytest.raises(ValueError, match="missing field 'bias'"):
        RelevanceModel.from_dict(missing)
    with pytest.raises(ValueError, match="'weights' must be an object"):
        RelevanceModel.from_dict({**data, "weights": [1, 2]})
    with pytest.raises(ValueError, match="relevance model"):
        RelevanceModel.from_dict({**data, "bias": "high"})
    with pytest.raises(ValueError, match="must be >= 0"):
        RelevanceModel.from_dict({**data, "weights": {"text_exchange": -1}})


# --- answerability --------------------------------------------------------------------------------

# answerability = sigmoid(20 × (best cosine − 0.2)): 0.5 at a best cosine of 0.2, ≥ 0.7 from ~0.243.
ANSWERING = RelevanceModel(embedding_model="test", version="answering", bias=5.0, weights={},
                           answerable_bias=-4.0, answerable_weights={"best_cos_distillation": 20.0})


def test_an_unanswerable_query_recalls_nothing_not_even_a_core_memory() -> None:
    # The best of the user's memories is far from the query (best cosine 0.05): the least-bad
    # memory stands out among the others (standing ≈ 1), but nothing answers the question.
    far = [_candidate("core", tier="core", signals=_signals(0.05)),
           _candidate("medium", tier="medium", signals=_signals(0.02, best_cos=0.05))]
    assert ANSWERING.answerability(far[0].signals) < 0.4
    assert rank_memories(far, model=ANSWERING, params=RecallParams(), now=NOW) == []
    # The same memories for a query the user's memories come close to are recalled.
    near = [_candidate("core", tier="core", signals=_signals(0.45)),
            _candidate("medium", tier="medium", signals=_signals(0.40, best_cos=0.45))]
    ranked = rank_memories(near, model=ANSWERING, params=RecallParams(), now=NOW)
    assert {r.id for r in ranked} == {"core", "medium"}
    top = ranked[0]
    assert top.relevance == pytest.approx(top.standing * top.answerability)
    assert top.explain()["answerability"] == pytest.approx(ANSWERING.answerability(near[0].signals))
    assert top.explain()["standing"] == pytest.approx(ANSWERING.standing(near[0].signals))


def test_answerability_gate_is_not_widened_by_the_tier() -> None:
    # Answerability 0.5: a core memory's standing bar is 0.4, but the query must still be answerable (>= t).
    borderline = [_candidate("core", tier="core", signals=_signals(0.2))]
    assert ANSWERING.answerability(borderline[0].signals) == pytest.approx(0.5)
    assert rank_memories(borderline, model=ANSWERING, params=RecallParams(), now=NOW) == []
    assert [r.id for r in rank_memories(borderline, model=ANSWERING, params=RecallParams(threshold=0.5),
                                        now=NOW)] == ["core"]


def test_answerable_weights_must_be_positive_and_known() -> None:
    with pytest.raises(ValueError, match="answerable weights"):
        RelevanceModel(embedding_model="t", version="v", bias=0.0, weights={}, answerable_weights={
            "best_cos_distillation": -1.0})
    with pytest.raises(ValueError, match="unknown features"):
        RelevanceModel(embedding_model="t", version="v", bias=0.0, weights={}, answerable_weights={"cos": 1.0})
    model = RelevanceModel.from_dict(ANSWERING.to_dict())
    assert model == ANSWERING


def test_usefulness_undoes_the_standing_operating_point() -> None:
    # Fitted at even odds with bias 0, then shifted by +2 for recall's lenient gate.
    shifted = RelevanceModel(embedding_model="test", version="shifted", bias=2.0, weights={"gap_distillation": 10.0},
                             standing_shift=2.0)
    second_best = _signals(0.3, best_cos=0.4)  # gap -0.1: logit 2 - 1 = 1 for recall, -1 at even odds
    assert shifted.relevance(second_best) == pytest.approx(1 / (1 + math.exp(-1.0)))
    assert shifted.usefulness(second_best) == pytest.approx(1 / (1 + math.exp(1.0)))
    assert RelevanceModel.from_dict(shifted.to_dict()).standing_shift == 2.0
