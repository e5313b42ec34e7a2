"""Parsing explicit forget commands (DESIGN §4); anything else is not a command.

Four forms, keywords case-insensitive, the whole message being the command:
``/forget <id>[, <id> …]``, ``/forget <exact phrase>``, ``forget this memory`` (with the id of
the memory in context) and ``delete memory: <id>``. An id deletes; a phrase only searches, and
its candidates must be confirmed, so a phrase that merely looks like a mistyped id is harmless.
In a chat (the memory proxy) the confirmation is a message too: ``/forget confirm <token>``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

_UUID_RE: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)
_SEPARATORS_RE: Final = re.compile(r"[\s,]+")
_SLASH_FORGET_RE: Final = re.compile(r"/forget(?:\s+(?P<rest>.*))?", re.IGNORECASE | re.DOTALL)
_FORGET_THIS_RE: Final = re.compile(r"forget\s+this\s+memory[.!]?", re.IGNORECASE)
_DELETE_MEMORY_RE: Final = re.compile(r"delete\s+memory\s*:(?P<rest>.*)", re.IGNORECASE | re.DOTALL)
# A chat has no confirm button: the proxy answers a phrase with a token to send back this way.
_CONFIRM_RE: Final = re.compile(r"/forget\s+confirm\s+(?P<token>[A-Za-z0-9_-]{16,128})", re.IGNORECASE)
_QUOTE_PAIRS: Final = (('"', '"'), ("'", "'"), ("\u201c", "\u201d"), ("\u2018", "\u2019"))


class ForgetCommandError(ValueError):
    """A forget command that is recognisably meant but cannot be carried out as written."""


@dataclass(frozen=True)
class ForgetByIds:
    """Delete these memories (lower-case UUID strings, in the order given, without repeats)."""

    ids: tuple[str, ...]


@dataclass(frozen=True)
class ForgetByPhrase:
    """Search for memories containing this exact phrase; the user confirms what is deleted."""

    phrase: str


def is_memory_id(text: str) -> bool:
    """True when ``text`` is a UUID in the hyphenated form, any case."""
    return _UUID_RE.fullmatch(text) is not None


def _ids(text: str) -> tuple[str, ...] | None:
    tokens = [t for t in _SEPARATORS_RE.split(text) if t]
    if not tokens or not all(is_memory_id(t) for t in tokens):
        return None
    return tuple(dict.fromkeys(t.lower() for t in tokens))


def _unquote(text: str) -> tuple[str, bool]:
    for opening, closing in _QUOTE_PAIRS:
        if len(text) >= 2 and text.startswith(opening) and text.endswith(closing):
            return text[1:-1], True
    return text, False


def _parse_slash_forget(rest: str) -> ForgetByIds | ForgetByPhrase:
    rest = rest.strip()
    if not _SEPARATORS_RE.sub("", rest):
        raise ForgetCommandError("'/forget' needs a memory id or a phrase after it, e.g. '/forget my old address'")
    phrase, quoted = _unquote(rest)
    # Quotes say "this is text": a quoted UUID is searched for, not deleted.
    ids = None if quoted else _ids(rest)
    if ids is not None:
        return ForgetByIds(ids)
    if not phrase.strip():
        raise ForgetCommandError("'/forget' was given an empty phrase; put the words to forget between the quotes")
    return ForgetByPhrase(phrase)


def parse_forget_command(text: str, context_memory_id: str | None = None) -> ForgetByIds | ForgetByPhrase | None:
    """The forget command in ``text``, or None when ``text`` is not an explicit forget command.

    ``context_memory_id`` is the memory the user is looking at, needed by ``forget this memory``.
    Raises :class:`ForgetCommandError` for a command that cannot be carried out as written.
    """
    message = text.strip()
    if (match := _SLASH_FORGET_RE.fullmatch(message)) is not None:
        return _parse_slash_forget(match.group("rest") or "")
    if _FORGET_THIS_RE.fullmatch(message):
        if context_memory_id is None or not str(context_memory_id).strip():
            raise ForgetCommandError("'forget this memory' needs a memory in context; use '/forget <id>' instead")
        if not is_memory_id(str(context_memory_id).strip()):
            raise ForgetCommandError(f"the memory in context has an invalid id {context_memory_id!r}")
        return ForgetByIds((str(context_memory_id).strip().lower(),))
    if (match := _DELETE_MEMORY_RE.fullmatch(message)) is not None:
        rest = match.group("rest").strip()
        if not rest:
            raise ForgetCommandError("'delete memory:' needs a memory id after it, e.g. 'delete memory: <uuid>'")
        ids = _ids(rest)
        if ids is None:
            raise ForgetCommandError(f"'delete memory:' needs memory ids (UUIDs), got {rest[:60]!r}")
        return ForgetByIds(ids)
    return None


def parse_forget_confirmation(text: str) -> str | None:
    """The token of ``/forget confirm <token>`` (the chat form of confirming a phrase's candidates), else None.

    Checked before :func:`parse_forget_command`, which would read "confirm …" as a phrase; to
    search for memories that say "confirm" followed by a token-like word, quote the phrase.
    """
    match = _CONFIRM_RE.fullmatch(text.strip())
    return None if match is None else match.group("token")
