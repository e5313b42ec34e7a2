"""Exchanges (one user turn and the assistant's reply) as stored raw memories.

The text is normalised once, before hashing and storing, so the same exchange ingested twice —
from the API, a dropped file with Windows line endings, or an import — is recognised as the same.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

# The longest user message or answer a turn stores (``POST /api/turns``, the memory proxy).
MAX_TURN_MESSAGE_CHARS: Final = 200_000
# The longest text recall searches with (``/api/context``; the proxy searches with a message's end).
MAX_RECALL_QUERY_CHARS: Final = 10_000

_EXCHANGE_RE: Final = re.compile(r"User:[ ]?(?P<user>.*?)\nAssistant:[ ]?(?P<assistant>.*)", re.DOTALL)


def turn_refusal(user: str, assistant: str) -> str | None:
    """Why a turn cannot be stored as it is (what ``POST /api/turns`` refuses with 422), or None."""
    for name, text in (("user message", user), ("assistant message", assistant)):
        if not text.strip():
            return f"the {name} is blank"
        if "\x00" in text:
            return f"the {name} contains NUL characters"
        if len(text) > MAX_TURN_MESSAGE_CHARS:
            return f"the {name} is longer than {MAX_TURN_MESSAGE_CHARS:,} characters"
    return None


def format_exchange(user: str, assistant: str) -> str:
    """``User: <user>\\nAssistant: <assistant>``."""
    return f"User: {user}\nAssistant: {assistant}"


def normalise_exchange_text(content: str) -> str:
    """CRLF/CR become LF, trailing whitespace goes from each line and blank lines from both ends.

    Everything else, including leading indentation and inner blank lines, is kept byte for byte.
    """
    lines = [line.rstrip() for line in content.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    start, end = 0, len(lines)
    while start < end and not lines[start]:
        start += 1
    while end > start and not lines[end - 1]:
        end -= 1
    return "\n".join(lines[start:end])


def content_sha256(content: str) -> str:
    """Hex SHA-256 of the normalised text, the key that makes ingestion idempotent."""
    return hashlib.sha256(normalise_exchange_text(content).encode("utf-8")).hexdigest()


def parse_exchange(content: str) -> tuple[str, str] | None:
    """``(user, assistant)`` from text in :func:`format_exchange` form, else None.

    The first ``\\nAssistant:`` ends the user's part, so the assistant's reply may itself quote
    "Assistant:" lines.
    """
    match = _EXCHANGE_RE.fullmatch(content.replace("\r\n", "\n").replace("\r", "\n"))
    if match is None:
        return None
    return match.group("user"), match.group("assistant")


def users_words(content: str) -> tuple[str, str | None]:
    """What the user said in an exchange, and the assistant's reply (None when the text is not
    in :func:`format_exchange` form: then all of it is taken as said)."""
    parsed = parse_exchange(content)
    if parsed is None:
        return content.strip(), None
    user, assistant = parsed
    return user.strip(), assistant.strip() or None


def same_words(a: str, b: str) -> bool:
    """Whether two texts say the same words (case, spacing and end punctuation aside)."""
    def words(text: str) -> str:
        return " ".join(text.casefold().split()).strip(" .!?…")
    return words(a) == words(b)
