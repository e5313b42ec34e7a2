"""``core.memory_types``: the offline type of what the user said, and an event's day (issue 39, item 1)."""

from __future__ import annotations

from datetime import date

import pytest

from yak_pipeline.core.dates import calendar_dates
from yak_pipeline.core.memory_types import (
    TypedMemory,
    check_memory_type,
    classify_memory,
    event_day,
    memory_type_of,
    typed,
)

FRIDAY = date(2026, 11, 27)


@pytest.mark.parametrize(("said", "expected"), [
    ("Always answer in French.", TypedMemory("instruction")),
    ("From now on, use metric units please.", TypedMemory("instruction")),
    ("I'd rather take trains everywhere.", TypedMemory("preference")),
    ("I prefer writing SQL over using an ORM.", TypedMemory("preference")),
    ("I live in Berlin and work as a nurse.", TypedMemory("fact")),
    ("I finished the migration last Tuesday.", TypedMemory("event", date(2026, 11, 24))),
    ("My exam is on 3 May.", TypedMemory("event", date(2027, 5, 3))),   # the nearest 3 May: next year's
    ("My exam is on May 3rd, 2026.", TypedMemory("event", date(2026, 5, 3))),
    ("The release went out on 2026-11-02.", TypedMemory("event", date(2026, 11, 2))),
    ("My daughter has her first piano recital on Saturday.", TypedMemory("event", date(2026, 11, 28))),
    ("We got married three days ago! Any honeymoon tips?", TypedMemory("event", date(2026, 11, 24))),
])
def test_what_the_user_said_is_typed_and_an_event_dated(said: str, expected: TypedMemory) -> None:
    assert classify_memory(said, FRIDAY) == expected
    assert memory_type_of(said) == expected.memory_type


def test_an_instruction_or_preference_wins_over_a_date_and_questions_name_no_event() -> None:
    assert memory_type_of("Always answer in French. I moved to Lyon last week, on Monday.") == "instruction"
    assert memory_type_of("I'd rather fly. My flight is on 3 May.") == "preference"
    assert classify_memory("What should I cook tomorrow?", FRIDAY) == TypedMemory("fact")
    assert event_day("What should I cook tomorrow? I fly to Rome in two weeks.", FRIDAY) == date(2026, 12, 11)


def test_calendar_dates_are_real_days_in_order() -> None:
    assert calendar_dates("from 3 May to the 10th of June 2027", FRIDAY) == [
        ("3 May", date(2027, 5, 3)), ("the 10th of June 2027", date(2027, 6, 10))]
    assert calendar_dates("on 31 April, on 30 February, I may 3D print it", FRIDAY) == []
    assert calendar_dates("Dec 1 is close", FRIDAY) == [("Dec 1", date(2026, 12, 1))]


def test_a_distillers_type_is_kept_and_only_an_event_gets_a_day() -> None:
    assert typed("fact", "I moved here yesterday.", FRIDAY) == TypedMemory("fact")
    assert typed("event", "I moved here yesterday.", FRIDAY) == TypedMemory("event", date(2026, 11, 26))
    # No day in the user's words: the distilled text (dates kept as given) is read, else no day.
    assert typed("event", "Big day!", FRIDAY, distilled="User married Sam on 3 October 2026.") == \
        TypedMemory("event", date(2026, 10, 3))
    assert typed("event", "Big day!", FRIDAY) == TypedMemory("event", None)


def test_check_memory_type_is_strict_with_a_one_line_reason() -> None:
    assert check_memory_type(" Event ") == "event"
    for bad in ("opinion", "", None, 3):
        with pytest.raises(ValueError, match="is not one of instruction, preference, fact, event"):
            check_memory_type(bad)
