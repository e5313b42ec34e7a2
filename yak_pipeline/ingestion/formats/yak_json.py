"""Yak's own JSON drop files, without any disk I/O: ``.jsonl`` (one exchange object per line) and
``.json`` (one object, or a list of them), each object read by :func:`record_from_object`."""

from __future__ import annotations

import json
import re
from functools import partial
from typing import Final

from pydantic import BaseModel, ConfigDict, ValidationError

from yak_pipeline.core.exchanges import format_exchange
from yak_pipeline.ingestion.formats.exchange_records import (
    ExchangeRecord,
    FatalError,
    FileRecords,
    ParsedFile,
    RecordError,
    json_kind,
    record_user,
)
from yak_pipeline.ingestion.formats.record_fields import (
    EXCHANGE_FORM,
    ExchangeParts,
    MessageText,
    OptionalTimestamp,
    UserId,
    validation_reason,
)

# JSON's own whitespace: a line holding anything else (a form feed, U+2028) is not blank but bad.
JSON_WHITESPACE: Final = " \t\r\n"
_JSON_WHITESPACE_RE: Final = re.compile(r"[ \t\r\n]*")


# --- .jsonl ---------------------------------------------------------------------------------------


def parse_jsonl(text: str, max_record_chars: int, default_user: str | None) -> ParsedFile:
    """A ``.jsonl`` file's text: each non-blank line one exchange object."""
    read = FileRecords(max_record_chars)
    # Only "\n" ends a line: JSON strings cannot hold a raw newline, and other line breaks
    # (U+2028, a lone CR) must not shift the line numbers a user sees in an editor.
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip(JSON_WHITESPACE):
            read.read(number, line, partial(_jsonl_record, line, number, default_user))
    return read.parsed()


def _jsonl_record(line: str, number: int, default_user: str | None) -> ExchangeRecord:
    return record_from_object(_load_json_record(line), number, default_user)


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
    read = FileRecords(max_record_chars)
    for index, (raw, value) in enumerate(items, start=1):
        read.read(index, raw, partial(record_from_object, value, index, default_user))
    return read.parsed()


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


class _Exchange(BaseModel):
    """What every JSON exchange object may hold besides its text; other keys are ignored."""

    model_config = ConfigDict(extra="ignore")

    user_id: UserId = None
    occurred_at: OptionalTimestamp = None


class _ExchangePair(_Exchange):
    """An exchange given as ``user`` and ``assistant`` strings."""

    user: MessageText
    assistant: MessageText


class _ExchangeContent(_Exchange):
    """An exchange given as ``content`` in ``User: …\nAssistant: …`` form."""

    content: ExchangeParts


def record_from_object(value: object, line: int, default_user: str | None = None) -> ExchangeRecord:
    """One JSON exchange object: ``user_id`` (or ``default_user``), ``user`` + ``assistant`` or
    ``content``, an optional ``occurred_at``; :class:`RecordError` naming the field that is wrong otherwise."""
    if not isinstance(value, dict):
        raise RecordError(f"expected a JSON object with user_id, user and assistant, got {json_kind(value)}")
    exchange: _Exchange
    try:
        if "user" in value or "assistant" in value:
            pair = _ExchangePair.model_validate(value)
            exchange, user, assistant = pair, pair.user, pair.assistant
        elif "content" in value:
            whole = _ExchangeContent.model_validate(value)
            exchange, (user, assistant) = whole, whole.content
        else:
            raise RecordError(f'needs "user" and "assistant" strings, or "content" in {EXCHANGE_FORM} form')
    except ValidationError as error:
        raise RecordError(validation_reason(error)) from None
    return ExchangeRecord(record_user(exchange.user_id, default_user), format_exchange(user, assistant),
                          exchange.occurred_at, line)
