"""What every history-file reader yields, and the checks they share: without any disk I/O.

A reader returns :class:`ExchangeRecord` for each exchange it can store and :class:`RejectedRecord`
(its source line, raw text and a one-line reason) for each it cannot, so the caller can quarantine
it instead of dropping it; a whole file that cannot be read is a :class:`FatalError`. The checks
(:func:`decode_text`, :func:`check_storable`, :func:`check_size`, :func:`parse_timestamp`, …) are
the same for Yak's own drop files (:mod:`~yak_pipeline.ingestion.formats.exchange_files`) and for
other tools' exports.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from yak_pipeline.core.exchanges import format_exchange

T = TypeVar("T")

DEFAULT_MAX_RECORD_CHARS: Final[int] = 200_000
# Reasons quote user input (a 10 MB user id, say); they stay short enough to read in a log line.
_MAX_REASON_CHARS: Final = 300
_UTF8_BOM: Final = "\ufeff"


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

    @classmethod
    def because(cls, line: int, raw: str, reason: object) -> RejectedRecord:
        """``raw`` (from ``line``) rejected for ``reason`` (an error, or its text), cut to one short line."""
        return cls(line, raw, one_line(str(reason)))


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

    def add(self, built: ExchangeRecord | RejectedRecord) -> None:
        """Keep what :func:`build_exchange_record` made of one exchange: a record, or its rejection."""
        if isinstance(built, ExchangeRecord):
            self.records.append(built)
        else:
            self.rejected.append(built)


@dataclass
class FileRecords:
    """What a drop file's reader has read so far: each record stored or rejected with its reason."""

    max_record_chars: int
    records: list[ExchangeRecord] = field(default_factory=list)
    rejected: list[RejectedRecord] = field(default_factory=list)

    def read(self, line: int, raw: str, build: Callable[[], ExchangeRecord]) -> None:
        """Keep the record ``build`` makes of ``raw`` (from ``line``); reject it, with the reason, when
        it is too long (before ``build`` runs: one enormous line cannot stall the reader) or when
        ``build`` raises :class:`RecordError`."""
        try:
            check_size(raw, self.max_record_chars)
            self.records.append(build())
        except RecordError as error:
            self.reject(line, raw, str(error))

    def reject(self, line: int, raw: str, reason: str) -> None:
        """Reject ``raw`` (from ``line``) for ``reason``, cut to one short line."""
        self.rejected.append(RejectedRecord.because(line, raw, reason))

    def parsed(self) -> ParsedFile:
        """The file's records and rejected records."""
        return ParsedFile(tuple(self.records), tuple(self.rejected), None)


class RecordError(ValueError):
    """Why one record cannot be ingested; becomes a :class:`RejectedRecord` reason."""


class FatalError(ValueError):
    """Why a whole file cannot be parsed, with the line the problem is on."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")


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
        return RejectedRecord.because(line, raw, error)
    return ExchangeRecord(user_id, content, occurred_at, line, ref=ref)


def record_user(user_id: str | None, default_user: str | None) -> str:
    """Whose a record is: its own ``user_id`` (which must be the file's ``default_user`` when it has
    one), else ``default_user``; :class:`RecordError` naming the field when neither is given."""
    if user_id is None:
        if default_user is None:
            raise RecordError("user_id: field required")
        return default_user
    if default_user is not None and user_id != default_user:
        raise RecordError(f"record is for user {user_id!r}, not {default_user!r}")
    return user_id


def storable_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored as text (``"contains a NUL character …"``), or None when it can."""
    # JSON escapes can smuggle in what UTF-8 bytes cannot: NUL and unpaired surrogates, neither
    # of which PostgreSQL (or any UTF-8 consumer) can store.
    if "\x00" in text:
        return "contains a NUL character (\\u0000), which cannot be stored"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return f"contains an unpaired surrogate (\\u{ord(text[error.start]):04x}), which is not valid Unicode"
    return None


def check_storable(text: str, name: str) -> None:
    """:class:`RecordError` if ``text`` (called ``name`` in the reason) cannot be stored as text."""
    problem = storable_problem(text)
    if problem is not None:
        raise RecordError(f"{name} {problem}")


def check_size(raw: str, max_record_chars: int) -> None:
    """:class:`RecordError` if a record is longer than ``max_record_chars`` characters."""
    if len(raw) > max_record_chars:
        raise RecordError(f"record is {len(raw)} characters, more than {max_record_chars}")


def timestamp_of(value: object) -> datetime:
    """An ISO-8601 date or datetime string as a UTC datetime (a naive one is taken as UTC);
    :class:`RecordError` saying what is wrong with it otherwise (without naming the field)."""
    if not isinstance(value, str):
        raise RecordError(f"must be an ISO-8601 date or datetime string, got {json_kind(value)}")
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise RecordError(f"{value!r} is not an ISO-8601 date or datetime") from None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00+01:00 falls before year 1 in UTC
        raise RecordError(f"{value!r} is out of range") from None


def parse_timestamp(value: object, name: str) -> datetime:
    """:func:`timestamp_of`, its reason naming the field ``name`` (``"created_at '…' is not …"``)."""
    try:
        return timestamp_of(value)
    except RecordError as error:
        raise RecordError(f"{name} {error}") from None


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


def one_line(reason: str) -> str:
    """``reason`` on one line and at most :data:`_MAX_REASON_CHARS` characters."""
    flat = " ".join(reason.splitlines())
    return flat if len(flat) <= _MAX_REASON_CHARS else flat[: _MAX_REASON_CHARS - 1] + "…"
