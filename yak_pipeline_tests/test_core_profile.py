"""``core.profile``: which of the user's sentences are standing instructions or preferences, and
which lines the block carries within its budget."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from yak_pipeline.core.block_choice import line_tokens
from yak_pipeline.core.profile import MAX_LINE_WORDS, ProfileLine, choose_profile, profile_reference, profile_statements


@pytest.mark.parametrize(("said", "kind", "text"), [
    ("Always answer me in British English.", "instruction", "Always answer me in British English."),
    ("Always format all code snippets with syntax highlighting when I ask about implementation details.",
     "instruction",
     "Always format all code snippets with syntax highlighting when I ask about implementation details."),
    ("Thanks! Please never use emojis in replies.", "instruction", "Please never use emojis in replies."),
    ("From now on, reply in Dutch.", "instruction", "From now on, reply in Dutch."),
    ("I want you to always include sources.", "instruction", "I want you to always include sources."),
    ("I prefer minimal dependencies.", "preference", "I prefer minimal dependencies"),
    # A preference inside a long request: the clause, cut where the request goes on.
    ("I'm trying to keep my app lightweight, so I prefer simple, minimal dependencies, how can I keep Flask small?",
     "preference", "I prefer simple, minimal dependencies"),
    ("Honestly I'd rather have short answers than long ones.", "preference",
     "I'd rather have short answers than long ones"),
    ("My preference is tabs over spaces, can you set that up?", "preference", "My preference is tabs over spaces"),
])
def test_a_stated_instruction_or_preference_becomes_one_line(said: str, kind: str, text: str) -> None:
    [found] = profile_statements(said)
    assert (found.kind, found.text) == (kind, text)


@pytest.mark.parametrize("said", [
    "Always here to help!",                      # a greeting, not an order
    "Never had a chance to visit it.",
    "I always walk the dog at seven.",           # a habit: a fact, not an instruction to the assistant
    "Would I prefer the window seat, do you think?",
    "Which do you prefer, tea or coffee?",
    "`always use tabs` = config line",           # code
    "My sister is called Ines.",
])
def test_facts_greetings_questions_and_code_are_not_profile_lines(said: str) -> None:
    assert profile_statements(said) == []


def test_sentences_keep_their_positions_and_a_long_line_is_capped() -> None:
    long = "Always " + " ".join(["answer"] * 60) + "."
    found = profile_statements(f"I prefer green tea at night. Hello there. {long}")
    assert [(s.kind, s.position) for s in found] == [("preference", 0), ("instruction", 2)]
    assert len(found[1].text.split()) == MAX_LINE_WORDS and found[1].text.endswith("…")


def _line(i: int, kind: str, text: str, days_ago: int) -> ProfileLine:
    return ProfileLine(id=f"id-{i}", memory_id=f"m-{i}", kind=kind, text=text,  # type: ignore[arg-type]
                       said_at=datetime(2026, 11, 27, tzinfo=UTC) - timedelta(days=days_ago))


def test_the_block_carries_instructions_first_newest_first_one_per_wording_within_budget() -> None:
    lines = [_line(1, "preference", "I prefer tea", 1), _line(2, "instruction", "Always answer briefly.", 5),
             _line(3, "instruction", "Never use emojis.", 2), _line(4, "instruction", "never use emojis", 9)]
    assert [line.id for line in choose_profile(lines, 1000)] == ["id-3", "id-2", "id-1"]
    # The budget keeps what fits, in that order; a longer line is skipped, a shorter one after it may fit.
    two = line_tokens("Never use emojis.") + line_tokens("I prefer tea")
    assert [line.id for line in choose_profile(lines, two)] == ["id-3", "id-1"]
    assert [line.id for line in choose_profile(lines, line_tokens("Never use emojis.") - 1)] == ["id-1"]
    assert choose_profile(lines, line_tokens("I prefer tea") - 1) == []
    assert choose_profile(lines, 0) == []


@pytest.mark.parametrize(("phrase", "meant"), [
    ("that preference", ("preference", False)), ("my instructions", ("instruction", True)),
    ("the last instruction.", ("instruction", False)), ("Preferences", ("preference", True)),
    ("my preference for tea", None), ("minimal dependencies", None),
])
def test_a_forget_phrase_can_name_the_profile(phrase: str, meant: tuple[str, bool] | None) -> None:
    assert profile_reference(phrase) == meant
