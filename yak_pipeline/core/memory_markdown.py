"""A user's current knowledge as a MEMORY.md: grouped by type (facts by tier), dated, in an order
that diffs cleanly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime
from typing import Final

from yak_pipeline.core.types import MEMORY_TYPES, TIERS

TIER_HEADINGS: Final[dict[str, str]] = {
    "core": "Core — who the user is, what matters most",
    "medium": "Medium — useful context",
    "low": "Low — passing details",
}

TYPE_HEADINGS: Final[dict[str, str]] = {
    "instruction": "Instructions — how the user wants to be answered",
    "preference": "Preferences — what the user prefers",
    "fact": "Facts — who the user is, what they do",
    "event": "Events — what happened, or will, by day",
}


PROFILE_HEADING: Final = "How to answer — standing instructions and preferences, in the user's words"


def render_memory_markdown(user_id: str, items: Sequence[Mapping[str, object]],
                           profile: Sequence[tuple[str, str, datetime]] = ()) -> str:
    """The MEMORY.md text for ``user_id``'s ``items`` (``content``, ``tier``, ``refreshed_at``,
    ``needs_review``, ``memory_type`` (default ``fact``) and ``event_on``).

    ``profile``: the user's profile lines (kind, text, when said; ``core.profile``), listed first,
    as every memory block carries them, ``- YYYY-MM-DD (kind): "text"``, oldest first.

    Then one section per memory type (``core.memory_types``): instructions, preferences, facts
    (under their tier, core first) and events. Each memory is one bullet, ``- YYYY-MM-DD: text``
    (the date it was last stated or revised, UTC), oldest first with ties broken by text: new
    knowledge lands at the end of its section, so two exports of a growing memory differ only where
    it changed. An event leads with its day, ``- YYYY-MM-DD (said YYYY-MM-DD): text``, in the order
    of the days (an event without a day is placed by when it was said, as other memories). Nothing
    in the file depends on when it was made. A memory still awaiting a person's review (confidence
    0.6–0.8) says so.
    """
    lines = [f"# MEMORY.md: {user_id}", ""]
    if profile:
        lines += [f"## {PROFILE_HEADING}", ""]
        lines += [f'- {day} ({kind}): "{text}"' for day, kind, text in
                  sorted((_date(when), kind, _one_line(text)) for kind, text, when in profile)]
        lines.append("")
    if not items:
        lines += ["Yak holds no current knowledge about this user yet.", ""]
        return "\n".join(lines)
    latest = max(_date(item["refreshed_at"]) for item in items)
    count = f"{len(items)} memory" if len(items) == 1 else f"{len(items)} memories"
    lines += [f"What Yak knows about {user_id}: {count}, the latest from {latest}. Rebuilt from "
              "the database at any time; superseded memories and those held back for review are left out.", ""]
    for memory_type in MEMORY_TYPES:
        of_type = [item for item in items if str(item.get("memory_type") or "fact") == memory_type]
        if not of_type:
            continue
        lines += [f"## {TYPE_HEADINGS[memory_type]}", ""]
        if memory_type == "event":
            lines += _event_bullets(of_type) + [""]
        elif memory_type == "fact":
            for tier in TIERS:
                bullets = _bullets([item for item in of_type if item["tier"] == tier])
                if bullets:
                    lines += [f"### {TIER_HEADINGS[tier]}", ""] + bullets + [""]
        else:
            lines += _bullets(of_type) + [""]
    return "\n".join(lines)


def _unreviewed(item: Mapping[str, object]) -> str:
    return " _(unreviewed)_" if item.get("needs_review") else ""


def _bullets(items: Sequence[Mapping[str, object]]) -> list[str]:
    rows = sorted((_date(item["refreshed_at"]), _one_line(str(item["content"])), _unreviewed(item)) for item in items)
    return [f"- {day}: {text}{mark}" for day, text, mark in rows]


def _event_bullets(items: Sequence[Mapping[str, object]]) -> list[str]:
    rows = []
    for item in items:
        said, on = _date(item["refreshed_at"]), item.get("event_on")
        day = _date(on) if isinstance(on, date) else None
        lead = f"{day} (said {said})" if day else said
        rows.append((day or said, said, _one_line(str(item["content"])), lead, _unreviewed(item)))
    return [f"- {lead}: {text}{mark}" for _, _, text, lead, mark in sorted(rows)]


def _date(value: object) -> str:
    if isinstance(value, datetime):
        return (value if value.tzinfo is None else value.astimezone(UTC)).date().isoformat()
    if isinstance(value, date):
        return value.isoformat()
    return str(value)[:10]


def _one_line(text: str) -> str:
    return " ".join(text.split())
