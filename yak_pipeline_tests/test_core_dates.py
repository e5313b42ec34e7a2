"""``core.dates``: relative dates in what the user said, resolved against the day they said it,
and named in the memory block's line (issue 39, item 4)."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from yak_pipeline.core.dates import MAX_RESOLVED, resolve_relative_dates
from yak_pipeline.core.memory_block import BlockMemory, render_memory_block

FRIDAY = date(2026, 11, 27)


@pytest.mark.parametrize(("said", "day"), [
    ("today", date(2026, 11, 27)), ("yesterday", date(2026, 11, 26)), ("Tomorrow", date(2026, 11, 28)),
    ("the day before yesterday", date(2026, 11, 25)),
    ("last Tuesday", date(2026, 11, 24)), ("last Friday", date(2026, 11, 20)),   # a week back on a Friday
    ("next Friday", date(2026, 12, 4)), ("this Friday", date(2026, 11, 27)), ("on Monday", date(2026, 11, 30)),
    ("3 days ago", date(2026, 11, 24)), ("two weeks ago", date(2026, 11, 13)), ("a week ago", date(2026, 11, 20)),
    ("in 10 days", date(2026, 12, 7)), ("in a couple of weeks", date(2026, 12, 11)),
])
def test_each_expression_means_one_day(said: str, day: date) -> None:
    assert resolve_relative_dates(f"I did it {said}, really.", FRIDAY) == [(said, day)]


def test_vague_or_absolute_dates_are_left_as_said_and_a_line_names_a_few_at_most() -> None:
    assert resolve_relative_dates("last month, recently, on 3 March, someday", FRIDAY) == []
    many = "yesterday, today, tomorrow, last Monday and next Monday"
    assert len(resolve_relative_dates(many, FRIDAY)) == MAX_RESOLVED
    assert resolve_relative_dates("yesterday and again yesterday", FRIDAY) == [("yesterday", date(2026, 11, 26))]


def test_the_block_line_names_the_day_a_relative_date_means() -> None:
    block = render_memory_block([BlockMemory(id="m", content="I finished the draft last Tuesday; the deadline is "
                                                               "in two weeks", tier="medium", kind="raw",
                                             occurred_at=datetime(2026, 11, 27, 10, tzinfo=UTC))])
    assert ('- (the user\'s own words, said on 27 Nov 2026; "last Tuesday" is 24 Nov 2026; "in two weeks" is '
            '11 Dec 2026) "I finished the draft last Tuesday; the deadline is in two weeks"') in block


def test_a_standing_instruction_keeps_its_relative_dates_unresolved() -> None:
    said = datetime(2026, 11, 27, 10, tzinfo=UTC)
    block = render_memory_block([BlockMemory(id="p", content="Always tell me tomorrow's weather first.", tier="core",
                                             kind="instruction", occurred_at=said),
                                 BlockMemory(id="m", content="The dentist is tomorrow.", tier="medium", kind="raw",
                                             occurred_at=said)])
    assert "- (instruction, said on 27 Nov 2026) \"Always tell me tomorrow's weather first.\"" in block
    assert '(the user\'s own words, said on 27 Nov 2026; "tomorrow" is 28 Nov 2026)' in block
