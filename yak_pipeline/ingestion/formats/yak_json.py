"""Yak's own JSON drop files, without any disk I/O: ``.jsonl`` (one exchange object per line) and
``.json`` (one object, or a list of them), each object read by :func:`record_from_object`."""

from __future__ import annotations

import json
import re
from typing import Final

from yak_pipeline.core.exchanges import format_exchange, parse_exchange
from yak_pipeline.core.types import InvalidUserId, validate_user_id
from yak_pipeline.ingestion.formats.exchange_records import (
    ExchangeRecord,
    FatalError,
    ParsedFile,
    RecordError,
    RejectedRecord,
    check_default_user,
    check_size,
    check_storable,
    json_kind,
    one_line,
    parse_timestamp,
)

# JSON's own whitespace: a line holding anything else (a form feed, U+2028) is not blank but bad.
JSON_WHITESPACE: Final = " \t\r\n"
_JSON_WHITESPACE_RE: Final = re.compile(r"[ \t\r\n]*")
_EXCHANGE_FORM: Final = "'User: …\\nAssistant: …'"


# --- .jsonl ---------------------------------------------------------------------------------------


def parse_jsonl(text: str, max_record_chars: int, default_user: str | None) -> ParsedFile:
    """A ``.jsonl`` file's text: each non-blank line one exchange object."""
    records: list[ExchangeRecord] = []
    rejected: list[RejectedRecord] = []
    # Only "\n" ends a line: JSON strings cannot hold a raw newline, and other line breaks
    # (U+2028, a lone CR) must not shift the line numbers a user sees in an editor.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip(JSON_WHITESPACE):
            continue
        try:
            check_size(line, max_record_chars)
            records.append(record_from_object(_load_json_record(line), number, default_user))
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


def parse_json(text: str, max_record_chars: int, default_user: str | None) -> ParsedFile:
    """A ``.json`` file's text: one exchange object, or a list of them (``line``: the item's index + 1)."""
    start = _skip_json_whitespace(text, 0)
    if text[start] == "[":
        items = _scan_json_list(text, start)
        if not items:
            raise FatalError(_line_at(text, start), "the JSON list is empty: there is no exchange in it")
    else:
        items = [(text[start:].rstrip(JSON_WHITESPACE), _load_json_document(text, start))]
    records: list[ExchangeRecord] = []
    rejected: list[RejectedRecord] = []
    for index, (raw, value) in enumerate(items, start=1):
        try:
            check_size(raw, max_record_chars)
            records.append(record_from_object(value, index, default_user))
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


def record_from_object(value: object, line: int, default_user: str | None = None) -> ExchangeRecord:
    """One JSON exchange object: ``user_id`` (or ``default_user``), ``user`` + ``assistant`` or
    ``content``, an optional ``occurred_at``; :class:`RecordError` saying what is wrong otherwise."""
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
        check_default_user(user_id, default_user)
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
