"""Parsing exchange files dropped into the drop folder (.jsonl, .json, .md), without any disk I/O.

The caller hands over a file's name and bytes and gets back a :class:`ParsedFile`:

- ``records`` — the exchanges that passed validation, content in ``User: …\\nAssistant: …`` form;
- ``rejected`` — each bad record with its source line, its raw text and a one-line reason, so the
  caller can quarantine it instead of dropping it;
- ``fatal`` — set (``"line N: reason"``) when the file as a whole cannot be read: not UTF-8, empty,
  invalid JSON in a .json file, a transcript without front matter or without any exchange.

Formats:

- ``.jsonl`` — one JSON object per line; blank lines are skipped. Each object holds ``user_id`` and
  either ``user`` + ``assistant`` strings or ``content`` in ``User: …\\nAssistant: …`` form, plus
  an optional ``occurred_at`` (ISO-8601 date or datetime). Other keys are ignored.
- ``.json`` — one such object, or a list of them (``line`` is then the item's index + 1).
- ``.md`` — front matter between ``---`` lines with ``user_id:`` and ``date:``, then blocks that
  start with a line beginning ``User:`` or ``Assistant:`` and run, over any number of lines, to the
  next such line. Each User block followed by an Assistant block is one exchange, dated ``date``.
  Text before the first block (a title, say) is not an exchange and is ignored.

A ``default_user`` (``yak import --user``, a drop-folder user folder) stands in for a missing
``user_id``; a record naming another user is rejected. Exports of other tools (ChatGPT, Claude)
are read by :mod:`yak_pipeline.core.history_files`, which falls back to this module for Yak's own.

Parsing never raises, whatever the bytes: any problem becomes a rejected record or ``fatal``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from yak_pipeline.core.exchanges import format_exchange, parse_exchange
from yak_pipeline.core.types import InvalidUserId, validate_user_id

T = TypeVar("T")

SUPPORTED_SUFFIXES: Final[tuple[str, ...]] = (".jsonl", ".json", ".md")
DEFAULT_MAX_RECORD_CHARS: Final[int] = 200_000

# Reasons quote user input (a 10 MB user id, say); they stay short enough to read in a log line.
_MAX_REASON_CHARS: Final = 300
# JSON's own whitespace: a line holding anything else (a form feed, U+2028) is not blank but bad.
_JSON_WHITESPACE: Final = " \t\r\n"
_JSON_WHITESPACE_RE: Final = re.compile(r"[ \t\r\n]*")
_UTF8_BOM: Final = "\ufeff"
_FRONT_MATTER_FENCE: Final = "---"
_FRONT_MATTER_LINE_RE: Final = re.compile(r"(?P<key>[A-Za-z_][A-Za-z0-9_-]*)\s*:\s*(?P<value>.*)")
_BLOCK_START_RE: Final = re.compile(r"(?P<role>User|Assistant):(?P<text>.*)")
_EXCHANGE_FORM: Final = "'User: …\\nAssistant: …'"


@dataclass(frozen=True)
class ExchangeRecord:
    """One valid exchange from a file; ``occurred_at`` is UTC, or None when the record has none."""

    user_id: str
    content: str
    occurred_at: datetime | None
    line: int
    # Where in its source the exchange came from beyond the line (an export's conversation and
    # message ids), kept in the memory's source_ref so it can be traced back.
    ref: str | None = None
    # Its answer may still grow (a Claude Code session read while open): a later import of the same
    # ref updates the stored memory in place instead of storing a second one.
    grows: bool = False


@dataclass(frozen=True)
class RejectedRecord:
    """One record that failed validation: where it was, its original text, and why (one line)."""

    line: int
    raw: str
    reason: str


@dataclass(frozen=True)
class ParsedFile:
    """Everything a file yielded; when ``fatal`` is set, ``records`` and ``rejected`` are empty."""

    records: tuple[ExchangeRecord, ...] = field(default_factory=tuple)
    rejected: tuple[RejectedRecord, ...] = field(default_factory=tuple)
    fatal: str | None = None


@dataclass
class ConversationExchanges:
    """What one conversation yielded: its exchanges, those that cannot be stored (with the reason),
    and how many turns were not exchanges."""

    records: list[ExchangeRecord]
    rejected: list[RejectedRecord]
    skipped: int


class RecordError(ValueError):
    """Why one record cannot be ingested; becomes a :class:`RejectedRecord` reason."""


class FatalError(ValueError):
    """Why a whole file cannot be parsed, with the line the problem is on."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")


def exchange_file_suffix(name: str) -> str | None:
    """The supported suffix of ``name`` in lower case (``".jsonl"``, ``".json"``, ``".md"``), else None."""
    dot = name.rfind(".")
    suffix = name[dot:].lower() if dot > 0 else ""
    return suffix if suffix in SUPPORTED_SUFFIXES else None


def parse_exchange_file(name: str, data: bytes, *, max_record_chars: int = DEFAULT_MAX_RECORD_CHARS,
                        default_user: str | None = None) -> ParsedFile:
    """Parse one dropped file's bytes into records, rejected records, or a fatal reason; never raises.

    The format is chosen by the suffix of ``name``. A record longer than ``max_record_chars``
    characters is rejected rather than parsed, so one enormous line cannot stall ingestion.
    ``default_user`` (``yak import --user``, a drop-folder user folder) is the user of records
    and transcripts that name none; one that names another user is rejected.
    """
    suffix = exchange_file_suffix(name)
    if suffix is None:
        supported = ", ".join(SUPPORTED_SUFFIXES)
        return ParsedFile(fatal=one_line(f"unsupported file type {name!r}: use one of {supported}"))
    try:
        text = decode_text(data)
        if not text.strip(_JSON_WHITESPACE):
            raise FatalError(1, "file is empty")
        if suffix == ".jsonl":
            return _parse_jsonl(text, max_record_chars, default_user)
        if suffix == ".json":
            return _parse_json(text, max_record_chars, default_user)
        return _parse_markdown(text, max_record_chars, default_user)
    except FatalError as error:
        return ParsedFile(fatal=one_line(str(error)))


def decode_text(data: bytes) -> str:
    """A file's bytes as text (UTF-8, a byte-order mark dropped); :class:`FatalError` saying what it is otherwise."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        offset = error.start
        hint = "; it looks like UTF-16, save it as UTF-8" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise FatalError(
            data.count(b"\n", 0, offset) + 1, f"not UTF-8 text (byte 0x{data[offset]:02x} at offset {offset}){hint}"
        ) from None
    text = text.removeprefix(_UTF8_BOM)
    # UTF-16 without a byte-order mark decodes as "UTF-8" full of NULs, and PostgreSQL text
    # cannot hold NUL anyway; say what the file probably is instead of rejecting every line.
    nul = text.find("\x00")
    if nul >= 0:
        raise FatalError(
            text.count("\n", 0, nul) + 1,
            "contains a NUL character (a binary or UTF-16 file?); save it as UTF-8 text",
        )
    return text


# --- .jsonl ---------------------------------------------------------------------------------------


def _parse_jsonl(text: str, max_record_chars: int, default_user: str | None) -> ParsedFile:
    records: list[ExchangeRecord] = []
    rejected: list[RejectedRecord] = []
    # Only "\n" ends a line: JSON strings cannot hold a raw newline, and other line breaks
    # (U+2028, a lone CR) must not shift the line numbers a user sees in an editor.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip(_JSON_WHITESPACE):
            continue
        try:
            check_size(line, max_record_chars)
            records.append(_record_from_object(_load_json_record(line), number, default_user))
        except RecordError as error:
            rejected.append(RejectedRecord(number, line, one_line(str(error))))
    return ParsedFile(tuple(records), tuple(rejected), None)


def _load_json_record(line: str) -> object:
    try:
        return json.loads(line)
    except json.JSONDecodeError as error:
        raise RecordError(f"invalid JSON at column {error.colno}: {error.msg}") from None
    except RecursionError:
        raise RecordError("invalid JSON: nested too deep") from None
    except ValueError as error:  # e.g. an integer longer than Python's digit limit
        raise RecordError(f"invalid JSON: {error}") from None


# --- .json ----------------------------------------------------------------------------------------


def _parse_json(text: str, max_record_chars: int, default_user: str | None) -> ParsedFile:
    start = _skip_json_whitespace(text, 0)
    if text[start] == "[":
        items = _scan_json_list(text, start)
        if not items:
            raise FatalError(_line_at(text, start), "the JSON list is empty: there is no exchange in it")
    else:
        items = [(text[start:].rstrip(_JSON_WHITESPACE), _load_json_document(text, start))]
    records: list[ExchangeRecord] = []
    rejected: list[RejectedRecord] = []
    for index, (raw, value) in enumerate(items, start=1):
        try:
            check_size(raw, max_record_chars)
            records.append(_record_from_object(value, index, default_user))
        except RecordError as error:
            rejected.append(RejectedRecord(index, raw, one_line(str(error))))
    return ParsedFile(tuple(records), tuple(rejected), None)


def _decode_json(decoder: json.JSONDecoder, text: str, position: int, *, whole: bool = False) -> tuple[object, int]:
    """One JSON value at ``position`` (``whole``: the entire text) and where it ends; :class:`FatalError` if invalid."""
    try:
        if whole:
            return decoder.decode(text), len(text)
        return decoder.raw_decode(text, position)
    except json.JSONDecodeError as error:
        raise FatalError(error.lineno, f"invalid JSON at column {error.colno}: {error.msg}") from None
    except RecursionError:
        raise FatalError(_line_at(text, position), "invalid JSON: nested too deep") from None
    except ValueError as error:
        raise FatalError(_line_at(text, position), f"invalid JSON: {error}") from None


def _load_json_document(text: str, start: int) -> object:
    document, _ = _decode_json(json.JSONDecoder(), text, start, whole=True)
    if not isinstance(document, dict):
        raise FatalError(
            _line_at(text, start), f"expected a JSON object or a list of objects, got {json_kind(document)}"
        )
    return document


def _scan_json_list(text: str, start: int) -> list[tuple[str, object]]:
    """Each item of the top-level list with its exact source text, so a rejected item is kept verbatim."""
    decoder = json.JSONDecoder()
    items: list[tuple[str, object]] = []
    position = _skip_json_whitespace(text, start + 1)
    if position < len(text) and text[position] == "]":
        position += 1
    else:
        while True:
            value, end = _decode_json(decoder, text, position)
            items.append((text[position:end], value))
            position = _skip_json_whitespace(text, end)
            if position >= len(text):
                raise FatalError(_line_at(text, start), "invalid JSON: the list is never closed with ']'")
            if text[position] == "]":
                position += 1
                break
            if text[position] != ",":
                raise FatalError(_line_at(text, position), "invalid JSON: expected ',' or ']' between list items")
            position = _skip_json_whitespace(text, position + 1)
    if _skip_json_whitespace(text, position) < len(text):
        raise FatalError(_line_at(text, position), "invalid JSON: unexpected text after the list")
    return items


def _skip_json_whitespace(text: str, position: int) -> int:
    match = _JSON_WHITESPACE_RE.match(text, position)
    return match.end() if match is not None else position


def _line_at(text: str, position: int) -> int:
    return text.count("\n", 0, position) + 1


# --- one JSON record ------------------------------------------------------------------------------


def _record_from_object(value: object, line: int, default_user: str | None = None) -> ExchangeRecord:
    if not isinstance(value, dict):
        raise RecordError(f"expected a JSON object with user_id, user and assistant, got {json_kind(value)}")
    if "user_id" not in value:
        if default_user is None:
            raise RecordError("missing user_id")
        user_id = default_user
    else:
        try:
            user_id = validate_user_id(value["user_id"])
        except InvalidUserId as error:
            raise RecordError(str(error)) from None
        _check_default_user(user_id, default_user)
    if "user" in value or "assistant" in value:
        user = _required_text(value, "user")
        assistant = _required_text(value, "assistant")
    elif "content" in value:
        user, assistant = _split_content(value["content"])
    else:
        raise RecordError(f'needs "user" and "assistant" strings, or "content" in {_EXCHANGE_FORM} form')
    occurred_raw = value.get("occurred_at")
    occurred_at = None if occurred_raw is None else parse_timestamp(occurred_raw, "occurred_at")
    return ExchangeRecord(user_id, format_exchange(user, assistant), occurred_at, line)


def build_exchange_record(user_id: str, user: str, assistant: str, occurred_at: datetime, *, line: int,
                          ref: str | None, max_record_chars: int) -> ExchangeRecord | RejectedRecord:
    """One exchange read from another tool's export, checked as a drop-file record is.

    A bad one becomes a :class:`RejectedRecord` whose raw text is the exchange in Yak's own JSON
    form (``user_id``, ``user``, ``assistant``, ``occurred_at``): fixed, it can be dropped back in.
    """
    content = format_exchange(user, assistant)
    try:
        check_storable(user, "the user message")
        check_storable(assistant, "the assistant message")
        check_size(content, max_record_chars)
    except RecordError as error:
        raw = json.dumps({"user_id": user_id, "user": user, "assistant": assistant,
                          "occurred_at": occurred_at.isoformat(), "ref": ref})
        return RejectedRecord(line, raw, one_line(str(error)))
    return ExchangeRecord(user_id, content, occurred_at, line, ref=ref)


def _check_default_user(user_id: str, default_user: str | None) -> None:
    if default_user is not None and user_id != default_user:
        raise RecordError(f"record is for user {user_id!r}, not {default_user!r}")


def _required_text(record: dict[str, object], key: str) -> str:
    value = record.get(key)
    if value is None:
        raise RecordError(f"missing {key}")
    if not isinstance(value, str):
        raise RecordError(f"{key} must be a string, got {json_kind(value)}")
    text = value.strip()
    if not text:
        raise RecordError(f"{key} is empty")
    check_storable(text, key)
    return text


def _split_content(content: object) -> tuple[str, str]:
    if not isinstance(content, str):
        raise RecordError(f"content must be a string, got {json_kind(content)}")
    parts = parse_exchange(content.strip())
    if parts is None:
        raise RecordError(f"content is not in {_EXCHANGE_FORM} form")
    user, assistant = (part.strip() for part in parts)
    if not user:
        raise RecordError("content has an empty User part")
    if not assistant:
        raise RecordError("content has an empty Assistant part")
    check_storable(user, "content")
    check_storable(assistant, "content")
    return user, assistant


def check_storable(text: str, name: str) -> None:
    """:class:`RecordError` if ``text`` (called ``name`` in the reason) cannot be stored as text."""
    # JSON escapes can smuggle in what UTF-8 bytes cannot: NUL and unpaired surrogates, neither
    # of which PostgreSQL (or any UTF-8 consumer) can store.
    if "\x00" in text:
        raise RecordError(f"{name} contains a NUL character (\\u0000), which cannot be stored")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise RecordError(
            f"{name} contains an unpaired surrogate (\\u{ord(text[error.start]):04x}), which is not valid Unicode"
        ) from None


def check_size(raw: str, max_record_chars: int) -> None:
    """:class:`RecordError` if a record is longer than ``max_record_chars`` characters."""
    if len(raw) > max_record_chars:
        raise RecordError(f"record is {len(raw)} characters, more than {max_record_chars}")


def parse_timestamp(value: object, name: str) -> datetime:
    """An ISO-8601 date or datetime string as a UTC datetime; a naive one is taken as UTC."""
    if not isinstance(value, str):
        raise RecordError(f"{name} must be an ISO-8601 date or datetime string, got {json_kind(value)}")
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise RecordError(f"{name} {value!r} is not an ISO-8601 date or datetime") from None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00+01:00 falls before year 1 in UTC
        raise RecordError(f"{name} {value!r} is out of range") from None


def json_kind(value: object) -> str:
    """What a JSON value is, as a reason names it (``"a string"``, ``"null"``, …)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def conversation_part(conversation: object, key: str, kind: type[T], what: str) -> tuple[dict[str, Any], T]:
    """An exported conversation and its messages under ``key`` (a ``kind``), checked as the chat
    exports' readers need them; :class:`RecordError` naming ``what`` is missing otherwise."""
    if not isinstance(conversation, dict):
        raise RecordError(f"expected a conversation object, got {json_kind(conversation)}")
    part = conversation.get(key)
    if not isinstance(part, kind):
        raise RecordError(f"conversation has no {what}")
    return conversation, part


# --- .md ------------------------------------------------------------------------------------------


@dataclass
class _Block:
    role: str
    line: int
    lines: list[str]
    raw_lines: list[str]

    @property
    def text(self) -> str:
        return "\n".join(self.lines).strip()

    @property
    def raw(self) -> str:
        raw_lines = list(self.raw_lines)
        while raw_lines and not raw_lines[-1].strip():
            raw_lines.pop()
        return "\n".join(raw_lines)


def _parse_markdown(text: str, max_record_chars: int, default_user: str | None) -> ParsedFile:
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    user_id, occurred_at, body_start = _parse_front_matter(lines, default_user)
    blocks = _split_blocks(lines, body_start)
    records: list[ExchangeRecord] = []
    rejected: list[RejectedRecord] = []
    paired = False
    index = 0
    while index < len(blocks):
        block = blocks[index]
        reply = blocks[index + 1] if index + 1 < len(blocks) else None
        if block.role == "User" and reply is not None and reply.role == "Assistant":
            paired = True
            raw = f"{block.raw}\n{reply.raw}"
            try:
                check_size(raw, max_record_chars)
                records.append(ExchangeRecord(user_id, _markdown_exchange(block, reply), occurred_at, block.line))
            except RecordError as error:
                rejected.append(RejectedRecord(block.line, raw, one_line(str(error))))
            index += 2
            continue
        reason = (
            "User block has no Assistant block after it"
            if block.role == "User"
            else "Assistant block has no User block before it"
        )
        rejected.append(RejectedRecord(block.line, block.raw, reason))
        index += 1
    if not paired:
        first_line = blocks[0].line if blocks else min(body_start + 1, len(lines))
        raise FatalError(first_line, "no exchange found: expected a 'User:' block followed by an 'Assistant:' block")
    return ParsedFile(tuple(records), tuple(rejected), None)


def _parse_front_matter(lines: list[str], default_user: str | None) -> tuple[str, datetime, int]:
    """``(user_id, date, index of the first body line)`` from the ``---`` front matter."""
    opening = next((index for index, line in enumerate(lines) if line.strip()), None)
    if opening is None:  # only exotic whitespace (form feeds, U+2028): nothing to read
        raise FatalError(1, "file is empty")
    if lines[opening].strip() != _FRONT_MATTER_FENCE:
        raise FatalError(
            opening + 1, "no front matter: start the file with '---', 'user_id: …', 'date: …', '---' lines"
        )
    closing = next(
        (index for index in range(opening + 1, len(lines)) if lines[index].strip() == _FRONT_MATTER_FENCE), None
    )
    if closing is None:
        raise FatalError(opening + 1, "front matter is never closed with a '---' line")
    fields: dict[str, tuple[int, str]] = {}
    for index in range(opening + 1, closing):
        match = _FRONT_MATTER_LINE_RE.fullmatch(lines[index].strip())
        # Other YAML (lists, comments, nested keys) is allowed and ignored: only two keys matter.
        if match is None:
            continue
        key = match.group("key").lower()
        if key in fields:
            raise FatalError(index + 1, f"front matter gives {key} twice (first on line {fields[key][0]})")
        fields[key] = (index + 1, _front_matter_value(match.group("value")))
    if "user_id" not in fields and default_user is None:
        raise FatalError(closing + 1, "front matter has no user_id")
    if "date" not in fields:
        raise FatalError(closing + 1, "front matter has no date")
    user_line, user_id = fields.get("user_id", (closing + 1, default_user or ""))
    date_line, date_text = fields["date"]
    try:
        validate_user_id(user_id)
        _check_default_user(user_id, default_user)
    except (InvalidUserId, RecordError) as error:
        raise FatalError(user_line, str(error)) from None
    try:
        occurred_at = parse_timestamp(date_text, "date")
    except RecordError as error:
        raise FatalError(date_line, str(error)) from None
    return user_id, occurred_at, closing + 1


def _front_matter_value(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    # YAML's trailing comment: "date: 2024-05-01  # the day we moved"
    return value.split(" #", 1)[0].strip()


def _split_blocks(lines: list[str], body_start: int) -> list[_Block]:
    blocks: list[_Block] = []
    for index in range(body_start, len(lines)):
        match = _BLOCK_START_RE.match(lines[index])
        if match is not None:
            blocks.append(_Block(match.group("role"), index + 1, [match.group("text")], [lines[index]]))
        elif blocks:
            blocks[-1].lines.append(lines[index])
            blocks[-1].raw_lines.append(lines[index])
    return blocks


def _markdown_exchange(user_block: _Block, assistant_block: _Block) -> str:
    user, assistant = user_block.text, assistant_block.text
    if not user:
        raise RecordError("User block is empty")
    if not assistant:
        raise RecordError("Assistant block is empty")
    return format_exchange(user, assistant)


def one_line(reason: str) -> str:
    """``reason`` on one line and at most :data:`_MAX_REASON_CHARS` characters."""
    flat = " ".join(reason.splitlines())
    return flat if len(flat) <= _MAX_REASON_CHARS else flat[: _MAX_REASON_CHARS - 1] + "…"
