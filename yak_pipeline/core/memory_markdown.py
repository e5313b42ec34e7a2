"""A user's current knowledge as a MEMORY.md: grouped by tier, dated, in an order that diffs cleanly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Final

from yak_pipeline.core.types import TIERS

TIER_HEADINGS: Final[dict[str, str]] = {
    "core": "Core — who the user is, what matters most",
    "medium": "Medium — useful context",
    "low": "Low — passing details",
}


PROFILE_HEADING: Final = "How to answer — standing instructions and preferences, in the user's words"


def render_memory_markdown(user_id: str, items: Sequence[Mapping[str, object]],
                           profile: Sequence[tuple[str, str, datetime]] = ()) -> str:
    """The MEMORY.md text for ``user_id``'s ``items`` (``content``, ``tier``, ``refreshed_at``, ``needs_review``).

    ``profile``: the user's profile lines (kind, text, when said; ``core.profile``), listed first,
    as every memory block carries them, ``- YYYY-MM-DD (kind): "text"``, oldest first.

    Each memory is one bullet, ``- YYYY-MM-DD: text`` (the date it was last stated or revised,
    UTC), under its tier, oldest first with ties broken by text: new knowledge lands at the end
    of its section, so two exports of a growing memory differ only where it changed. Nothing in
    the file depends on when it was made. A memory still awaiting a person's review (confidence
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
    for tier in TIERS:
        bullets = sorted((_date(item["refreshed_at"]), _one_line(str(item["content"])), bool(item.get("needs_review")))
                         for item in items if item["tier"] == tier)
        if not bullets:
            continue
        lines += [f"## {TIER_HEADINGS[tier]}", ""]
        lines += [f"- {day}: {text}" + (" _(unreviewed)_" if unreviewed else "") for day, text, unreviewed in bullets]
        lines.append("")
    return "\n".join(lines)


def _date(value: object) -> str:
    if isinstance(value, datetime):
        return (value if value.tzinfo is None else value.astimezone(UTC)).date().isoformat()
    return str(value)[:10]


def _one_line(text: str) -> str:
    return " ".join(text.split())
