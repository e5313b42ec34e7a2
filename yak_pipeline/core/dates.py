"""Relative dates in what the user said, resolved against when they said it (issue 39, item 4).

"I finished the draft last Tuesday", said on 27 Nov 2026, is about 24 Nov 2026; "the deadline is
in two weeks" about 11 Dec. A model reading the block cannot count days from "last Tuesday" unless
it also does the calendar arithmetic against the line's date, and small models get that wrong. So
the block names the day each relative expression means (``core.memory_block``), computed here,
offline and deterministically. Only expressions whose day is certain are resolved (a weekday,
today/yesterday/tomorrow, "N days/weeks ago", "in N days/weeks"); "last month" or "recently" are
left as said.

Calendar dates ("on 3 May", "May 3rd, 2027", "2026-05-03") are read here too
(:func:`calendar_dates`): an event's day (``core.memory_types``), and a question's time window
("between August 11 and August 15", ``core.query_intent.query_parts``).
"""

from __future__ import annotations

import re
from datetime import date, timedelta
from typing import Final

# The weekdays and the month pattern are read by core.answer_kinds too (does a memory hold a date?).
WEEKDAYS: Final = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_NUMBERS: Final = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
                   "eight": 8, "nine": 9, "ten": 10, "a couple of": 2, "couple of": 2}
_NUMBER: Final = r"(\d{1,3}|a couple of|couple of|an?|one|two|three|four|five|six|seven|eight|nine|ten)"
_EXPRESSION: Final = re.compile(
    r"\b(?:(today|yesterday|tomorrow|the day before yesterday|the day after tomorrow)"
    r"|(last|this|next|on) (" + "|".join(WEEKDAYS) + r")"
    r"|" + _NUMBER + r" (days?|weeks?) ago"
    r"|in " + _NUMBER + r" (days?|weeks?))\b",
    re.IGNORECASE)
_FIXED: Final = {"today": 0, "yesterday": -1, "tomorrow": 1, "the day before yesterday": -2,
                 "the day after tomorrow": 2}
_MONTHS: Final = ("january", "february", "march", "april", "may", "june", "july", "august", "september",
                  "october", "november", "december")
# Full names and the usual abbreviations ("Sept" too); "may" only in full, as it is a month.
MONTH: Final = (r"(jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|"
                 r"sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)")
_DAY: Final = r"(\d{1,2})(?:st|nd|rd|th)?"
_YEAR: Final = r"(?:,?\s+(\d{4}))?"
_DAY_MONTH: Final = re.compile(r"\b(?:the\s+)?" + _DAY + r"\s+(?:of\s+)?" + MONTH + r"\.?" + _YEAR + r"\b", re.IGNORECASE)
_MONTH_DAY: Final = re.compile(r"\b" + MONTH + r"\.?\s+(?:the\s+)?" + _DAY + r"\b" + _YEAR, re.IGNORECASE)
_ISO: Final = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
# At most this many resolved expressions are named per memory: a line stays a line.
MAX_RESOLVED: Final = 3


def _count(word: str) -> int:
    return int(word) if word.isdigit() else _NUMBERS[word.lower()]


def _weekday(which: str, name: str, said: date) -> date:
    target = WEEKDAYS.index(name.lower())
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


def _month(name: str) -> int:
    return next(i for i, month in enumerate(_MONTHS, 1) if month.startswith(name.lower().rstrip(".")[:3]))


def _nearest(year: int | None, month: int, day: int, said: date) -> date | None:
    """The day, in the year given, or without one the occurrence nearest the day it was said."""
    years = [year] if year is not None else [said.year - 1, said.year, said.year + 1]
    found = []
    for candidate in years:
        try:
            found.append(date(candidate, month, day))
        except ValueError:  # 31 April, 29 February of a common year
            continue
    return min(found, key=lambda d: (abs((d - said).days), d)) if found else None


def calendar_dates(text: str, said: date) -> list[tuple[str, date]]:
    """Each calendar date in ``text`` (as written) with its day, in order; a date without a year is
    the occurrence nearest ``said`` ("3 May" said in November is next May's)."""
    found: list[tuple[int, str, date]] = []
    for match in _DAY_MONTH.finditer(text):
        day = _nearest(int(match.group(3)) if match.group(3) else None, _month(match.group(2)),
                       int(match.group(1)), said)
        if day is not None:
            found.append((match.start(), match.group(0), day))
    for match in _MONTH_DAY.finditer(text):
        day = _nearest(int(match.group(3)) if match.group(3) else None, _month(match.group(1)),
                       int(match.group(2)), said)
        if day is not None and not any(start <= match.start() < start + len(phrase) for start, phrase, _ in found):
            found.append((match.start(), match.group(0), day))
    for match in _ISO.finditer(text):
        day = _nearest(int(match.group(1)), int(match.group(2)), int(match.group(3)), said)
        if day is not None:
            found.append((match.start(), match.group(0), day))
    return [(phrase, day) for _, phrase, day in sorted(found, key=lambda item: item[0])]
