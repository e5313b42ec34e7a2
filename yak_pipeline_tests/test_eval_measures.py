"""The evaluation's extra measures: never-said questions, superseded turns, current-first, abstention."""

from __future__ import annotations

import pytest

from yak_pipeline.core.query_intent import asks_about_present
from yak_pipeline.eval.locomo import parse_locomo
from yak_pipeline.eval.metrics import abstained, block_scores, current_first, score_ranking
from yak_pipeline.eval.superseded import derive_superseded, given_up_stems
from yak_pipeline_tests.test_eval_locomo import _turn


def knowledge_update_locomo() -> list[dict]:
    """One small conversation in LoCoMo format: a person who moves home, sells a car, changes job."""
    conversation = {
        "speaker_a": "Maya", "speaker_b": "Assistant",
        "session_1_date_time": "9:00 am on 3 March, 2024",
        "session_1": [
            _turn("Maya", "D1:1", "Long night shift again, I'm shattered."),
            _turn("Assistant", "D1:2", "Sounds exhausting. Did you get any sleep?"),
            _turn("Maya", "D1:3", "A bit. My flat in Chorlton is quiet in the afternoons."),
            _turn("Assistant", "D1:4", "A quiet flat helps a lot with day sleep."),
            _turn("Maya", "D1:5", "I drive my little red Fiat to the hospital every morning."),
            _turn("Assistant", "D1:6", "Handy for early starts."),
            _turn("Maya", "D1:7", "I work as a nurse on the children's ward."),
        ],
        "session_2_date_time": "6:30 pm on 14 May, 2024",
        "session_2": [
            _turn("Maya", "D2:1", "My sister visited on Sunday with her twins."),
            _turn("Assistant", "D2:2", "How lovely, how old are they?"),
            _turn("Maya", "D2:3", "Four, and they ate all my biscuits."),
        ],
        "session_3_date_time": "11:15 am on 2 September, 2024",
        "session_3": [
            _turn("Maya", "D3:1", "I got the keys to my terraced house in Stockport today, bye bye Chorlton!"),
            _turn("Assistant", "D3:2", "Congratulations! How does it feel?"),
            _turn("Maya", "D3:3", "Also I sold the Fiat, I cycle in on a Brompton now."),
            _turn("Assistant", "D3:4", "Good for your fitness."),
            _turn("Maya", "D3:5", "And I started a new post in the neonatal unit."),
        ],
    }
    qa = [
        # Derived: the question asks about the present and the update names what it replaced.
        {"question": "Which town do I live in now?", "answer": "Stockport", "evidence": ["D3:1"], "category": 2},
        {"question": "What are my wheels at the moment?", "answer": "A Brompton bike", "evidence": ["D3:3"],
         "category": 2},
        # Derived, but nothing earlier shares a distinctive word: nothing is labelled.
        {"question": "Where am I employed currently?", "answer": "The neonatal unit", "evidence": ["D3:5"],
         "category": 2},
        # Explicit field wins (and is read leniently); an unknown id is counted, an evidence id dropped.
        {"question": "What do I do for work these days?", "answer": "Neonatal nurse", "evidence": ["D3:5"],
         "superseded": ["D1:7; D9:9", "D3:5"], "category": 2},
        {"question": "Where did I live before?", "answer": "Chorlton", "evidence": ["D1:3"],
         "old_evidence": [], "category": 4},
        {"question": "What car did I have?", "answer": "A Fiat", "evidence": ["D1:5"],
         "superseded_evidence": ["D:1:3"], "category": 4},
        # A "temporal" category 2 (LoCoMo's own meaning): not a knowledge update, nothing derived.
        {"question": "When did I move to Stockport?", "answer": "September 2024", "evidence": ["D3:1"],
         "category": 2},
        # Never said (no evidence) vs adversarial (evidence listed).
        {"question": "What's my brother's name?", "answer": "Not mentioned", "evidence": [], "category": 5},
        {"question": "Which university did I go to?", "answer": "Not mentioned", "category": 5},
        {"question": "What is my sister's Fiat called?", "adversarial_answer": "Rosie", "evidence": ["D1:5"],
         "category": 5},
    ]
    return [{"sample_id": "ku", "conversation": conversation, "qa": qa}]


def test_never_said_questions_are_kept_apart_and_adversarial_ones_still_skipped() -> None:
    (conversation,) = parse_locomo(knowledge_update_locomo())
    assert [q.question for q in conversation.never_said] == ["What's my brother's name?",
                                                             "Which university did I go to?"]
    assert all(q.category == 5 and q.evidence == frozenset() for q in conversation.never_said)
    assert all(q.category != 5 for q in conversation.questions)
    assert len(conversation.questions) == 7
    assert conversation.skipped == {"adversarial": 1, "other_category": 0, "no_evidence": 0,
                                    "unknown_evidence_ids": 1}


def test_superseded_explicit_field_wins_and_is_read_like_evidence() -> None:
    (conversation,) = parse_locomo(knowledge_update_locomo())
    by_text = {q.question: q for q in conversation.questions}
    assert by_text["What do I do for work these days?"].superseded == {"D1:7"}
    assert by_text["Where did I live before?"].superseded == frozenset()
    assert by_text["What car did I have?"].superseded == {"D1:3"}


def test_superseded_is_derived_for_present_tense_knowledge_updates_only() -> None:
    (conversation,) = parse_locomo(knowledge_update_locomo())
    by_text = {q.question: q for q in conversation.questions}
    assert by_text["Which town do I live in now?"].superseded == {"D1:3"}
    assert by_text["What are my wheels at the moment?"].superseded == {"D1:5"}
    assert by_text["Where am I employed currently?"].superseded == frozenset()
    assert by_text["When did I move to Stockport?"].superseded == frozenset()


def test_derivation_rules() -> None:
    assert asks_about_present("Who's my current partner?")
    assert asks_about_present("Do I still play bass with my group?")
    assert not asks_about_present("When did Caroline go to the support group?")
    assert not asks_about_present("How long has Caroline had her current group of friends for?")
    assert given_up_stems("Also I sold the Fiat, I cycle in now.") == {"fiat"}
    assert given_up_stems("I quit the run club when we moved.") == {"run"}
    (conversation,) = parse_locomo(knowledge_update_locomo())
    turns = conversation.turns
    # Only the same speaker, only earlier turns: the assistant's "quiet flat" is never chosen.
    assert derive_superseded(turns, ["D3:1"], "Which town do I live in now?") == {"D1:3"}
    assert derive_superseded(turns, ["D1:3"], "Where do I live?") == frozenset()
    # The threshold: with an impossible minimum nothing is labelled.
    assert derive_superseded(turns, ["D3:1"], "Which town do I live in now?", min_weight=100.0) == frozenset()
    assert derive_superseded(turns, ["D9:9"], "anything now?") == frozenset()


def test_derivation_skips_earlier_mentions_of_the_new_value() -> None:
    """An earlier "we're looking at Stockport" foreshadows the new home (the answer); it is not the old one."""
    data = knowledge_update_locomo()
    data[0]["conversation"]["session_2"].append(_turn("Maya", "D2:4", "We're viewing houses in Stockport."))
    data[0]["conversation"]["session_3"][0]["text"] = "I got the keys to my terraced house in Stockport today!"
    (conversation,) = parse_locomo(data)
    by_text = {q.question: q for q in conversation.questions}
    assert by_text["Which town do I live in now?"].superseded == frozenset()
    turns = conversation.turns
    assert derive_superseded(turns, ["D3:1"], "Which town do I live in now?", "Stockport") == frozenset()
    assert derive_superseded(turns, ["D3:1"], "Which town do I live in now?", "") == {"D2:4"}


def test_current_first() -> None:
    evidence, old = {"E"}, {"O"}
    assert current_first([["E"], ["O"]], evidence, old) == 1.0
    assert current_first([["O"], ["E"]], evidence, old) == 0.0
    assert current_first([["X"], ["E"]], evidence, old) == 1.0  # old one not retrieved: fine
    assert current_first([["O", "E"], ["O"]], evidence, old) == 1.0  # consolidated memory counts as current
    assert current_first([["X"], ["O"], ["E", "O"]], evidence, old) == 0.0
    assert current_first([["X"]] * 5 + [["E"]], evidence, old, k=5) == 0.0  # evidence below k
    assert current_first([["X"]] * 4 + [["E"]], evidence, old, k=5) == 1.0
    assert current_first([], evidence, old) == 0.0
    assert current_first([["X"], ["O"]], evidence, old) == 0.0
    assert current_first([("E2",), ("O",)], {"E1", "E2"}, old, k=1) == 1.0  # any evidence turn
    assert current_first([["E"]], evidence, set()) == 1.0  # no superseded turn: Hit@k
    assert current_first([["E"]], evidence, {"E"}) == 1.0  # listed in both: taken as evidence
    assert current_first(iter([["E"]]), evidence, old) == 1.0
    with pytest.raises(ValueError):
        current_first([["E"]], set(), old)
    with pytest.raises(ValueError):
        current_first([["E"]], evidence, old, k=0)


def test_abstained() -> None:
    assert abstained([]) == 1.0
    assert abstained(()) == 1.0
    assert abstained(iter([])) == 1.0
    assert abstained([["D1:1"]]) == 0.0
    assert abstained([[]]) == 0.0  # an item holding no turns was still returned


def test_score_ranking_unchanged_by_the_new_fields() -> None:
    (conversation,) = parse_locomo(knowledge_update_locomo())
    question = next(q for q in conversation.questions if q.question == "Which town do I live in now?")
    scores = score_ranking([["D1:3"], ["D3:1"]], question.evidence, [1, 5])
    assert scores["hit@1"] == 0.0 and scores["hit@5"] == 1.0 and scores["mrr"] == 0.5
    assert current_first([["D1:3"], ["D3:1"]], question.evidence, question.superseded) == 0.0


def test_block_scores_count_memories_turns_and_a_stale_lead() -> None:
    # Two of three memories hold evidence; both evidence turns are in.
    scores = block_scores([{"a"}, {"x"}, {"b", "c"}], {"a", "b"})
    assert scores == {"precision": 2 / 3, "recall": 1.0, "size": 3.0, "stale_lead": None}
    # An empty block has no precision, and recalls nothing.
    assert block_scores([], {"a"}) == {"precision": None, "recall": 0.0, "size": 0.0, "stale_lead": None}
    # Knowledge update: the old statement first is a stale lead; the current one first is not.
    assert block_scores([{"old"}, {"new"}], {"new"}, {"old"})["stale_lead"] == 1.0
    assert block_scores([{"x"}, {"new"}, {"old"}], {"new"}, {"old"})["stale_lead"] == 0.0
    # Only the old statement in the block: it leads; neither in it: no lead.
    assert block_scores([{"old"}], {"new"}, {"old"})["stale_lead"] == 1.0
    assert block_scores([{"x"}], {"new"}, {"old"})["stale_lead"] == 0.0
    # A memory holding both (versioned over the old) counts as current.
    assert block_scores([{"old", "new"}], {"new"}, {"old"})["stale_lead"] == 0.0
    with pytest.raises(ValueError):
        block_scores([{"a"}], set())
