"""Relative dates in what the user said, resolved against when they said it (issue 39, item 4).

"I finished the draft last Tuesday", said on 27 Nov 2026, is about 24 Nov 2026; "the deadline is
in two weeks" about 11 Dec. A model reading the block cannot count days from "last Tuesday" unless
it also does the calendar arithmetic against the line's date, and small models get that wrong. So
the block names the day each relative expression means (``core.memory_block``), computed here,
offline and deterministically. Only expressions whose day is certain are resolved (a weekday,
today/yesterday/tomorrow, "N days/weeks ago", "in N days/weeks"); "last month" or "recently" are
left as said.
"""

from __future__ import annotations

import re
from datetime import date, timedelta
from typing import Final

_WEEKDAYS: Final = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_NUMBERS: Final = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
                   "eight": 8, "nine": 9, "ten": 10, "a couple of": 2, "couple of": 2}
_NUMBER: Final = r"(\d{1,3}|a couple of|couple of|an?|one|two|three|four|five|six|seven|eight|nine|ten)"
_EXPRESSION: Final = re.compile(
    r"\b(?:(today|yesterday|tomorrow|the day before yesterday|the day after tomorrow)"
    r"|(last|this|next|on) (" + "|".join(_WEEKDAYS) + r")"
    r"|" + _NUMBER + r" (days?|weeks?) ago"
    r"|in " + _NUMBER + r" (days?|weeks?))\b",
    re.IGNORECASE)
_FIXED: Final = {"today": 0, "yesterday": -1, "tomorrow": 1, "the day before yesterday": -2,
                 "the day after tomorrow": 2}
# At most this many resolved expressions are named per memory: a line stays a line.
MAX_RESOLVED: Final = 3


def _count(word: str) -> int:
    return int(word) if word.isdigit() else _NUMBERS[word.lower()]


def _weekday(which: str, name: str, said: date) -> date:
    target = _WEEKDAYS.index(name.lower())
    which = which.lower()
    if which == "last":
        # The most recent such day before the day it was said ("last Tuesday" said on a Tuesday: a week ago).
        return said - timedelta(days=(said.weekday() - target - 1) % 7 + 1)
    if which == "next":
        return said + timedelta(days=(target - said.weekday() - 1) % 7 + 1)
    # "this Friday", "on Friday": the coming one, or the day itself.
    return said + timedelta(days=(target - said.weekday()) % 7)


def resolve_relative_dates(text: str, said: date) -> list[tuple[str, date]]:
    """Each relative date expression in ``text`` (as written) with the day it means, said on ``said``;
    in order, each expression once, at most :data:`MAX_RESOLVED`."""
    found: list[tuple[str, date]] = []
    for match in _EXPRESSION.finditer(text):
        phrase = match.group(0)
        if any(phrase.lower() == seen.lower() for seen, _ in found):
            continue
        if match.group(1):
            day = said + timedelta(days=_FIXED[match.group(1).lower()])
        elif match.group(2):
            day = _weekday(match.group(2), match.group(3), said)
        elif match.group(4):
            unit = 7 if match.group(5).lower().startswith("week") else 1
            day = said - timedelta(days=_count(match.group(4)) * unit)
        else:
            unit = 7 if match.group(7).lower().startswith("week") else 1
            day = said + timedelta(days=_count(match.group(6)) * unit)
        found.append((phrase, day))
        if len(found) == MAX_RESOLVED:
            break
    return found
