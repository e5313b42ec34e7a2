"""What kind of thing a question asks for, and whether a memory's words hold one (core.answer_kinds)."""

from __future__ import annotations

import pytest

from yak_pipeline.core.answer_kinds import holds_kind, wanted_kind


@pytest.mark.parametrize(("question", "kind"), [
    ("When did I move to Porto?", "date"),
    ("What year did we get married?", "date"),
    ("How long ago did I start running?", "date"),
    ("How many interviews have I secured for executive producer roles?", "number"),
    ("What age is my rescue hound reaching in early June?", "number"),
    ("How long is my commute?", "number"),
    ("What's my sibling's newborn son called?", "name"),
    ("Who's the woman I'm married to?", "name"),
    ("What's my spouse's name?", "name"),
    ("Where do I process my photos?", None),
    ("What do I do for a living?", None),
])
def test_the_kind_a_question_asks_for_is_read_from_its_words(question: str, kind: str | None) -> None:
    assert wanted_kind(question) == kind


def test_a_memory_holds_a_date_a_number_or_a_name() -> None:
    assert holds_kind("date", "User moved to Porto in March.")
    assert holds_kind("date", "We got married in 2019, on a Sunday.")
    assert holds_kind("date", "I started running three weeks ago")
    assert not holds_kind("date", "Porto is lovely, the food is great.")
    assert holds_kind("number", "I only secured 3 interviews")
    assert holds_kind("number", "Canela turns five next week.")
    assert not holds_kind("number", "I adopted a podenco from a shelter.")
    assert holds_kind("name", "Chioma had the baby on Saturday! A boy, they've named him Ebuka.")
    assert holds_kind("name", "Aiko, my wife, wants to bake the cake herself.") is False  # only the opening word
    assert holds_kind("name", "My wife Aiko wants to bake the cake herself.")
    # How a memory names its speaker is no name; nor is a sentence's first word.
    assert not holds_kind("name", "User is moving house. Everything is in boxes.")
    assert not holds_kind("name", "I am tired. I slept badly.")
    assert not holds_kind(None, "Chioma had the baby on Saturday, in 2024, at 3 kg.")
