"""Which history a file holds, told from its content, and its exchanges; without any disk I/O.

Formats (:data:`FORMATS`), detected from the bytes, the name's suffix only breaking ties:

- ``chatgpt`` — a ChatGPT data export: ``conversations.json`` (a list of conversations, each a
  ``mapping`` tree), or the export's ``.zip`` holding it (:mod:`yak_pipeline.ingestion.formats.chatgpt_export`);
- ``claude`` — a Claude.ai data export: ``conversations.json`` (conversations with
  ``chat_messages``), or its ``.zip`` (:mod:`yak_pipeline.ingestion.formats.claude_export`);
- ``claude_code`` — a Claude Code session transcript, JSONL (:mod:`yak_pipeline.ingestion.formats.claude_code_sessions`);
- ``yak`` — Yak's own drop files, ``.jsonl`` / ``.json`` / ``.md``, read exactly as before
  (:mod:`yak_pipeline.ingestion.formats.exchange_files`).

Exports name no user, so their exchanges go to the user the caller gives (``yak import --user``,
the drop folder's user folder); without one the file is refused with a line saying how to give
it. One bad conversation is rejected whole with its reason (its JSON kept verbatim, so the
quarantine file is itself an export to fix and import again); an export cut short (a truncated
download, a damaged zip) yields every conversation before the break, and the rest is rejected
as one piece with the place it breaks. A file of no known format gets one line naming the known ones.
"""

from __future__ import annotations

import json
import posixpath
import struct
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from io import BytesIO
from typing import Final

from yak_pipeline.ingestion.formats.chatgpt_export import chatgpt_exchanges, is_chatgpt_conversation
from yak_pipeline.ingestion.formats.claude_code_sessions import SessionRead, looks_like_session_entry, read_session
from yak_pipeline.ingestion.formats.claude_export import claude_exchanges, is_claude_conversation
from yak_pipeline.ingestion.formats.exchange_files import exchange_file_suffix, parse_exchange_file
from yak_pipeline.ingestion.formats.exchange_records import (
    DEFAULT_MAX_RECORD_CHARS,
    ConversationExchanges,
    ExchangeRecord,
    FatalError,
    RecordError,
    RejectedRecord,
    decode_text,
    one_line,
)

FORMATS: Final[dict[str, str]] = {
    "chatgpt": "ChatGPT data export (conversations.json, or the export's .zip)",
    "claude": "Claude.ai data export (conversations.json, or the export's .zip)",
    "claude_code": "Claude Code session transcript (.jsonl, one file per session)",
    "yak": "Yak drop file (.jsonl/.json records with user, assistant and user_id; .md with front matter)",
}
# The suffixes the drop folder reads; the content decides the format.
HISTORY_SUFFIXES: Final[tuple[str, ...]] = (".jsonl", ".json", ".md", ".zip")
KNOWN_FORMATS_LINE: Final = "Yak reads: " + "; ".join(FORMATS.values())
# A zip member is read up to this size: a "zip bomb" must not exhaust memory.
MAX_MEMBER_BYTES: Final = 4 * 1024**3
# Where an export's conversations are, inside its zip (any folder).
_CONVERSATIONS_MEMBER: Final = "conversations.json"
_ZIP_MAGIC: Final = b"PK\x03\x04"
_LOCAL_HEADER: Final = struct.Struct("<IHHHHHIIIHH")
# Keys one of Yak's own JSON records has at least one of.
_YAK_RECORD_KEYS: Final = frozenset({"user_id", "user", "assistant", "content"})
# Lines looked at to tell a Claude Code transcript from Yak's own JSONL.
_SNIFF_LINES: Final = 20
# Detection read the content and it is none of the formats (as opposed to: could not read it).
_UNKNOWN: Final = "unknown"


@dataclass
class ParsedHistory:
    """Everything a history file yielded; when ``fatal`` is set nothing else counts.

    ``skipped`` counts turns that are not exchanges (a prompt without a text answer, tool-only
    turns); ``quarantine_suffix`` is the form rejected records are written back in (``.json``
    for an export's conversations, whatever the file's own name); ``session`` is set for a
    Claude Code transcript (where a later read of the grown file starts).
    """

    format: str | None
    records: list[ExchangeRecord] = field(default_factory=list)
    rejected: list[RejectedRecord] = field(default_factory=list)
    skipped: int = 0
    fatal: str | None = None
    quarantine_suffix: str = ".jsonl"
    session: SessionRead | None = None
    # Why the file is damaged (it ends in the middle of a line or a conversation), in one line, when it
    # is: what was whole is still stored, and ``yak import`` exits non-zero saying so.
    damaged: str | None = None


def history_file_suffix(name: str) -> str | None:
    """The suffix of ``name`` (lower case) if the drop folder reads such files, else None."""
    dot = name.rfind(".")
    suffix = name[dot:].lower() if dot > 0 else ""
    return suffix if suffix in HISTORY_SUFFIXES else None


def unknown_format() -> str:
    """The one line a file of no known format gets."""
    return f"not a history format Yak knows. {KNOWN_FORMATS_LINE}"


def detect_format(name: str, data: bytes) -> str | None:
    """The format of a file's bytes (a key of :data:`FORMATS`), or None when none fits.

    The content decides. Only when it cannot (the first records are not even JSON) does a
    Yak drop file's suffix (.jsonl, .json, .md) make it ``yak``, so that its parse error names
    the line, as before; a ``.md`` file is always ``yak`` (no other format is Markdown).
    """
    if data.startswith(_ZIP_MAGIC):
        return _zip_format(data)
    suffix = exchange_file_suffix(name)
    if suffix == ".md":
        return "yak"
    try:
        text = decode_text(data).lstrip(" \t\r\n")
    except FatalError:
        return "yak" if suffix else None
    if text.startswith("["):
        kind = _list_format(text)
    elif text.startswith("{"):
        kind = _object_format(text)
    elif text.startswith("---"):
        kind = "yak"
    else:
        kind = None
    if kind == _UNKNOWN:
        return None
    return kind if kind is not None else ("yak" if suffix else None)


def parse_history_file(name: str, data: bytes, *, user_id: str | None = None, resume_at: int = 0,
                       max_record_chars: int = DEFAULT_MAX_RECORD_CHARS, detected: str | None = None) -> ParsedHistory:
    """Parse one history file for ``user_id`` (the user of exports, and of Yak records naming none).

    ``resume_at`` is where a Claude Code transcript read before grew from (see
    :func:`yak_pipeline.ingestion.formats.claude_code_sessions.read_session`); ``detected`` is the file's
    :func:`detect_format` when the caller has it already. Never raises.
    """
    kind = detected or detect_format(name, data)
    if kind is None:
        return ParsedHistory(None, fatal=unknown_format())
    if kind == "yak":
        parsed = parse_exchange_file(_yak_name(name, data), data, max_record_chars=max_record_chars,
                                     default_user=user_id)
        suffix = exchange_file_suffix(_yak_name(name, data)) or ".jsonl"
        return ParsedHistory("yak", list(parsed.records), list(parsed.rejected), 0, parsed.fatal, suffix)
    if user_id is None:
        return ParsedHistory(kind, fatal=(
            f"a {FORMATS[kind]} names no user: run `yak import {name} --user USER`, "
            f"or drop it into the drop folder's USER/ subfolder"))
    if kind == "claude_code":
        session = read_session(data, user_id=user_id, max_record_chars=max_record_chars, start=resume_at)
        damaged = None if session.cut_short_line is None else (
            f"line {session.cut_short_line} is cut short (the file ends in the middle of it): the exchanges before "
            "it were imported; import again once the file is whole")
        return ParsedHistory(kind, session.records, session.rejected, session.skipped, None, ".jsonl", session,
                             damaged)
    if data.startswith(_ZIP_MAGIC):
        return _parse_zip(kind, data, user_id, max_record_chars)
    return _parse_conversations(kind, data, user_id, max_record_chars)


# --- detection -----------------------------------------------------------------------------------


def _conversation_format(value: object) -> str | None:
    if is_chatgpt_conversation(value):
        return "chatgpt"
    if is_claude_conversation(value):
        return "claude"
    return None


def _list_format(text: str) -> str | None:
    """The format of a JSON list from its first item (or, if that is broken, the text's head);
    :data:`_UNKNOWN` when the item is none of them, None when nothing could be read."""
    position = _skip_space(text, 1)
    try:
        first, _ = json.JSONDecoder().raw_decode(text, position)
    except (ValueError, RecursionError):
        head = text[:65536]
        if '"mapping"' in head and '"create_time"' in head:
            return "chatgpt"
        if '"chat_messages"' in head:
            return "claude"
        return None
    return _conversation_format(first) or ("yak" if _is_yak_record(first) else _UNKNOWN)


def _object_format(text: str) -> str | None:
    """The format of a file of JSON objects: one object, or one per line (as :func:`_list_format`)."""
    try:
        whole = json.loads(text)
    except (ValueError, RecursionError):
        whole = None
    if whole is not None:
        if looks_like_session_entry(whole):
            return "claude_code"
        return _conversation_format(whole) or ("yak" if _is_yak_record(whole) else _UNKNOWN)
    kinds = set()
    for line in text.split("\n", _SNIFF_LINES)[:_SNIFF_LINES]:
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):
            continue
        kinds.add("claude_code" if looks_like_session_entry(entry) else "yak" if _is_yak_record(entry) else _UNKNOWN)
    # Yak's own records win a tie: they are what the drop folder always read.
    for kind in ("yak", "claude_code", _UNKNOWN):
        if kind in kinds:
            return kind
    return None


def _is_yak_record(value: object) -> bool:
    return isinstance(value, dict) and bool(_YAK_RECORD_KEYS & value.keys())


def _yak_name(name: str, data: bytes) -> str:
    """``name``, or one with the suffix Yak's own parser needs when the name has none it reads."""
    if exchange_file_suffix(name):
        return name
    text = data.lstrip(b"\xef\xbb\xbf \t\r\n")
    return name + (".md" if text.startswith(b"---") else ".json" if text.startswith(b"[") else ".jsonl")


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


# --- exports: conversations.json and its zip ---------------------------------------------------


_READERS: Final[dict[str, Callable[..., ConversationExchanges]]] = {
    "chatgpt": chatgpt_exchanges,
    "claude": claude_exchanges,
}


def _parse_conversations(kind: str, data: bytes, user_id: str, max_record_chars: int) -> ParsedHistory:
    """Every conversation of a ``conversations.json``; what follows a break is rejected as one piece."""
    result = ParsedHistory(kind, quarantine_suffix=".json")
    try:
        text = decode_text(data)
    except FatalError as error:
        result.fatal = one_line(str(error))
        return result
    start = _skip_space(text, 0)
    if text.startswith("{", start):  # a single conversation, not a list
        items, broken = _scan_items("[" + text[start:] + "]", 0)
    else:
        items, broken = _scan_items(text, start)
    reader = _READERS[kind]
    for index, (raw, conversation) in enumerate(items, start=1):
        try:
            read = reader(conversation, user_id=user_id, item=index, max_record_chars=max_record_chars)
        except RecordError as error:
            result.rejected.append(RejectedRecord.because(index, raw, f"{_title(conversation)}: {error}"))
            continue
        result.records.extend(read.records)
        result.rejected.extend(read.rejected)
        result.skipped += read.skipped
    if broken is not None:
        result.rejected.append(RejectedRecord(len(items) + 1, broken[0], broken[1]))
        result.damaged = broken[1]
    if not items and broken is None:
        result.fatal = "the export holds no conversation"
    return result


def _scan_items(text: str, start: int) -> tuple[list[tuple[str, object]], tuple[str, str] | None]:
    """The items of the JSON list at ``start`` with their source text, up to where the JSON breaks.

    Returns the items read and, if the list is cut short or damaged, ``(rest of the text, reason)``.
    """
    decoder = json.JSONDecoder()
    items: list[tuple[str, object]] = []
    position = _skip_space(text, start + 1)
    while position < len(text) and text[position] != "]":
        try:
            value, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError as error:
            return items, (text[position:], _break_reason(len(items), f"line {error.lineno} column {error.colno}: "
                                                                          f"{error.msg}"))
        except (RecursionError, ValueError) as error:
            return items, (text[position:], _break_reason(len(items), f"invalid JSON: {type(error).__name__}"))
        items.append((text[position:end], value))
        position = _skip_space(text, end)
        if position < len(text) and text[position] == ",":
            position = _skip_space(text, position + 1)
        elif position < len(text) and text[position] != "]":
            return items, (text[position:], _break_reason(len(items), "expected ',' or ']' between conversations"))
    if position >= len(text):
        return items, ("", _break_reason(len(items), "the list is never closed with ']'"))
    return items, None


def _break_reason(read: int, where: str) -> str:
    return one_line(f"the export breaks off after {read} conversation{'' if read == 1 else 's'} ({where}): "
                    "the rest of the file is kept here; export again or repair it")


def _title(conversation: object) -> str:
    if isinstance(conversation, dict):
        for key in ("title", "name"):
            if isinstance(conversation.get(key), str) and conversation[key]:
                return f"conversation {conversation[key][:80]!r}"
    return "conversation"


def _zip_members(data: bytes) -> list[bytes]:
    """The ``conversations.json`` members of an export's zip, each decompressed.

    A zip whose directory is missing or damaged (a download cut short) is read from its local
    headers: the member's bytes as far as they go, for :func:`_scan_items` to salvage.
    """
    try:
        with zipfile.ZipFile(BytesIO(data)) as archive:
            names = [n for n in archive.namelist() if posixpath.basename(n).lower() == _CONVERSATIONS_MEMBER]
            members = []
            for member in names:
                with archive.open(member) as handle:
                    members.append(handle.read(MAX_MEMBER_BYTES))
            return members
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError):
        return _salvage_members(data)


def _salvage_members(data: bytes) -> list[bytes]:
    """What can be inflated of each ``conversations.json`` from the zip's local file headers."""
    members = []
    position = data.find(_ZIP_MAGIC)
    while 0 <= position and position + _LOCAL_HEADER.size <= len(data):
        fields = _LOCAL_HEADER.unpack_from(data, position)
        flags, method, compressed, name_length, extra_length = fields[2], fields[3], fields[7], fields[9], fields[10]
        body = position + _LOCAL_HEADER.size + name_length + extra_length
        name = data[position + _LOCAL_HEADER.size: position + _LOCAL_HEADER.size + name_length].decode("utf-8", "replace")
        sized = compressed > 0 and not flags & 0x08
        end = min(body + compressed, len(data)) if sized else len(data)
        if posixpath.basename(name).lower() == _CONVERSATIONS_MEMBER:
            if method == 0:
                members.append(data[body:end])
            elif method == 8:
                inflater = zlib.decompressobj(-zlib.MAX_WBITS)
                try:
                    members.append(inflater.decompress(data[body:end], MAX_MEMBER_BYTES))
                except zlib.error:
                    pass
        position = data.find(_ZIP_MAGIC, end if sized else body)
    return members


def _zip_format(data: bytes) -> str | None:
    members = _zip_members(data)
    for member in members:
        try:
            kind = _list_format(decode_text(member).lstrip(" \t\r\n"))
        except FatalError:
            continue
        if kind in ("chatgpt", "claude"):
            return kind
    return None


def _parse_zip(kind: str, data: bytes, user_id: str, max_record_chars: int) -> ParsedHistory:
    result = ParsedHistory(kind, quarantine_suffix=".json")
    for member in _zip_members(data):
        part = _parse_conversations(kind, member, user_id, max_record_chars)
        if part.fatal is None:
            result.records += part.records
            result.rejected += part.rejected
            result.skipped += part.skipped
            result.damaged = result.damaged or part.damaged
    if not result.records and not result.rejected:
        result.fatal = "the zip holds no conversations.json with a conversation in it"
    return result
