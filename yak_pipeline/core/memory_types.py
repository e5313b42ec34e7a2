"""What kind of thing a memory says (issue 39): ``instruction``, ``preference``, ``fact`` or ``event``.

The distiller labels each memory; this is the offline label, read from the user's own words, which
the rules provider gives and which types the rows of a database upgraded to types (sql/017):

- ``instruction``: the user said how they want to be answered ("Always answer in French") — a
  sentence :func:`core.profile.profile_statements` reads as an instruction;
- ``preference``: the user said what they prefer ("I'd rather take trains") — likewise;
- ``event``: the user said something happened, or will, on a day that can be named: a relative day
  resolved against the day it was said (:mod:`core.dates`: "last Tuesday", "in two weeks",
  "tomorrow", "on Saturday") or a calendar date ("on 3 May", "May 3rd", "2026-05-03"). The event's
  day (:func:`event_day`) is stored with it;
- ``fact``: anything else (where they live, who they are, what they do).

The first that applies wins, in that order: a message that states an instruction is typed by it,
whatever else it says. Questions name no event ("What should I do tomorrow?"). Pure and offline.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Final

from yak_pipeline.core.dates import calendar_dates, resolve_relative_dates
from yak_pipeline.core.profile import profile_statements
from yak_pipeline.core.sentences import split_sentences
from yak_pipeline.core.types import MEMORY_TYPES, MemoryType

DEFAULT_MEMORY_TYPE: Final[MemoryType] = "fact"

@dataclass(frozen=True)
class TypedMemory:
    """A memory's type and, for an event, the day it happened (None when no day could be named)."""

    memory_type: MemoryType
    event_on: date | None = None


def check_memory_type(value: object) -> MemoryType:
    """``value`` as a memory type (letter case and spaces ignored); ``ValueError`` with a one-line reason."""
    if not isinstance(value, str) or value.strip().lower() not in MEMORY_TYPES:
        raise ValueError(f"type {value!r} is not one of {', '.join(MEMORY_TYPES)}")
    return value.strip().lower()  # type: ignore[return-value]  # checked against MEMORY_TYPES


def _statements(said: str) -> list[str]:
    """The sentences of ``said`` that state something (questions left out)."""
    return [s for s in split_sentences(said) if not s.rstrip(" \"')").endswith("?")]


def event_day(said: str, said_on: date) -> date | None:
    """The day the first dated statement in ``said`` names (relative days resolved against
    ``said_on``), or None when none names a day."""
    for sentence in _statements(said):
        days = [(sentence.find(phrase), day) for phrase, day in resolve_relative_dates(sentence, said_on)]
        days += [(sentence.find(phrase), day) for phrase, day in calendar_dates(sentence, said_on)]
        if days:
            return min(days, key=lambda item: item[0])[1]
    return None


def memory_type_of(said: str) -> MemoryType:
    """The type of what the user said (see the module docstring); ``fact`` when nothing else applies."""
    kinds = {statement.kind for statement in profile_statements(said)}
    if "instruction" in kinds:
        return "instruction"
    if "preference" in kinds:
        return "preference"
    # The day it was said does not matter to *whether* a day is named, only to which day.
    if event_day(said, date(2000, 1, 1)) is not None:
        return "event"
    return DEFAULT_MEMORY_TYPE


def classify_memory(said: str, said_on: date) -> TypedMemory:
    """What the user said, typed, with an event's day (resolved against ``said_on``)."""
    memory_type = memory_type_of(said)
    return TypedMemory(memory_type, event_day(said, said_on) if memory_type == "event" else None)


def typed(memory_type: MemoryType, said: str, said_on: date, *, distilled: str = "") -> TypedMemory:
    """A type given by the distiller, with an event's day read from what the user said (else from the
    ``distilled`` text, which keeps dates as given), resolved against ``said_on``; no day for others."""
    if memory_type != "event":
        return TypedMemory(memory_type)
    return TypedMemory("event", event_day(said, said_on) or (event_day(distilled, said_on) if distilled else None))
