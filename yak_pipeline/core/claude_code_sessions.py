"""The exchanges of a Claude Code session transcript (``~/.claude/projects/<project>/<session>.jsonl``), without I/O.

Claude Code appends one JSON object per line as a session goes: ``type`` ``user`` or
``assistant`` entries carry a ``message`` (``role``, ``content``) with a ``uuid``, a
``sessionId`` and a ``timestamp``; other types (``summary``, ``system``,
``file-history-snapshot``, ``progress``, …) are bookkeeping. Most lines are tool noise: the
assistant's ``tool_use`` and ``thinking`` blocks, and the ``tool_result`` blocks that come back
as ``user`` entries. Those are left out, as are subagents' lines (``isSidechain``), meta and
compaction messages Claude Code writes itself, local slash-command echoes and API error stand-ins.

What is left pairs up: a prompt the person typed, then every text block the assistant wrote
until the next prompt (across its tool calls), is one exchange, dated by the prompt. A prompt
answered only with tool calls, or not at all, is skipped.

Sessions grow: a resumed session appends to its file. :func:`read_session` can start at a byte
offset, and says where the next read should start (:attr:`SessionRead.resume_at`): the start of
the last prompt, so a turn still being written when the file was read is read again, whole,
next time. A last line cut short (the file was being written) is left for then, not rejected.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from yak_pipeline.core.exchange_files import (
    ExchangeRecord,
    RecordError,
    RejectedRecord,
    build_exchange_record,
    json_kind,
    one_line,
    parse_timestamp,
)

ENTRY_TYPES: Final = frozenset({"user", "assistant", "summary", "system", "file-history-snapshot", "progress"})
# Text Claude Code writes into the user's side itself: slash-command echoes, shell escapes, notices.
_NOT_TYPED_PREFIXES: Final = ("<command-name>", "<command-message>", "<command-args>", "<local-command-stdout>",
                              "<local-command-stderr>", "<bash-input>", "<bash-stdout>", "<bash-stderr>",
                              "[Request interrupted by user")
# How many lines from the top are searched for the session id (the first lines may be bookkeeping).
_SESSION_ID_LINES: Final = 50


@dataclass
class _Turn:
    prompt: str
    uuid: str
    timestamp: object
    line: int
    raw: str
    offset: int
    replies: list[str] = field(default_factory=list)
    seen: set[tuple[object, str]] = field(default_factory=set)


@dataclass
class SessionRead:
    """What one read of a transcript yielded, and where a later read of the grown file starts."""

    session_id: str | None
    records: list[ExchangeRecord] = field(default_factory=list)
    rejected: list[RejectedRecord] = field(default_factory=list)
    skipped: int = 0
    resume_at: int = 0


def looks_like_session_entry(value: object) -> bool:
    """Whether a JSON line looks like a Claude Code transcript entry."""
    return (isinstance(value, dict) and value.get("type") in ENTRY_TYPES
            and ("sessionId" in value or "message" in value or "leafUuid" in value))


def session_id_of(data: bytes) -> str | None:
    """The ``sessionId`` of a transcript, from the first lines that carry one; None if none does."""
    for line in data.split(b"\n", _SESSION_ID_LINES)[:_SESSION_ID_LINES]:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("sessionId"), str) and entry["sessionId"]:
            return entry["sessionId"]
    return None


def prefix_sha256(data: bytes, length: int) -> str:
    """Hex SHA-256 of the first ``length`` bytes: tells whether a file grew or was rewritten."""
    return hashlib.sha256(data[:length]).hexdigest()


def read_session(data: bytes, *, user_id: str, max_record_chars: int, start: int = 0) -> SessionRead:
    """The exchanges of a transcript from byte ``start`` (a line start) on; never raises."""
    result = SessionRead(session_id_of(data))
    stop = len(data)  # where reading ended: the end, or a last line cut short
    line_number = data.count(b"\n", 0, start)
    offset = start
    turn: _Turn | None = None
    while offset < len(data):
        end = data.find(b"\n", offset)
        complete = end >= 0
        end = end if complete else len(data)
        raw_bytes, line_start = data[offset:end], offset
        offset, line_number = end + 1, line_number + 1
        if not raw_bytes.strip():
            continue
        try:
            entry = _load_entry(raw_bytes)
        except RecordError as error:
            if not complete:
                stop = line_start  # cut short while being written: read it again, whole, next time
                break
            result.rejected.append(RejectedRecord(line_number, raw_bytes.decode("utf-8", "replace"),
                                                  one_line(str(error))))
            continue
        prompt = _typed_prompt(entry)
        if prompt is not None:
            _close(result, turn, user_id, max_record_chars)
            turn = _Turn(prompt, str(entry.get("uuid") or ""), entry.get("timestamp"), line_number,
                         raw_bytes.decode("utf-8"), line_start)
        elif turn is not None:
            message = entry.get("message") if entry.get("type") == "assistant" else None
            for text in _assistant_texts(entry, message):
                key = (message.get("id") if isinstance(message, dict) else None, text)
                if key not in turn.seen:  # a streamed message may be written more than once
                    turn.seen.add(key)
                    turn.replies.append(text)
    _close(result, turn, user_id, max_record_chars)
    result.resume_at = turn.offset if turn is not None else stop
    return result


def _load_entry(raw: bytes) -> dict:
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise RecordError(f"not UTF-8 text (byte 0x{raw[error.start]:02x} at column {error.start + 1})") from None
    except json.JSONDecodeError as error:
        raise RecordError(f"invalid JSON at column {error.colno}: {error.msg}") from None
    except (RecursionError, ValueError) as error:
        raise RecordError(f"invalid JSON: {type(error).__name__}") from None
    if not isinstance(value, dict):
        raise RecordError(f"expected a JSON object, got {json_kind(value)}")
    return value


def _typed_prompt(entry: dict) -> str | None:
    """The text a person typed, if this entry is such a prompt (not a tool result or Claude Code's own)."""
    if entry.get("type") != "user" or entry.get("isSidechain") or entry.get("isMeta") or entry.get("isCompactSummary"):
        return None
    message = entry.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        text = content.strip()
    elif isinstance(content, list):
        if any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content):
            return None
        text = "\n\n".join(b["text"].strip() for b in content if isinstance(b, dict) and b.get("type") == "text"
                           and isinstance(b.get("text"), str) and b["text"].strip())
    else:
        return None
    if not text or text.startswith(_NOT_TYPED_PREFIXES):
        return None
    return text


def _assistant_texts(entry: dict, message: object) -> list[str]:
    """The text blocks of an assistant entry (not its tool calls or thinking)."""
    if not isinstance(message, dict) or entry.get("isSidechain") or entry.get("isApiErrorMessage"):
        return []
    content = message.get("content")
    if isinstance(content, str):
        return [content.strip()] if content.strip() else []
    if not isinstance(content, list):
        return []
    return [b["text"].strip() for b in content if isinstance(b, dict) and b.get("type") == "text"
            and isinstance(b.get("text"), str) and b["text"].strip()]


def _close(result: SessionRead, turn: _Turn | None, user_id: str, max_record_chars: int) -> None:
    """Turn a finished prompt and its replies into an exchange, a rejected record, or a skipped turn."""
    if turn is None:
        return
    if not turn.replies:
        result.skipped += 1
        return
    try:
        when: datetime = parse_timestamp(turn.timestamp, "timestamp")
    except RecordError as error:
        result.rejected.append(RejectedRecord(turn.line, turn.raw, one_line(str(error))))
        return
    built = build_exchange_record(user_id, turn.prompt, "\n\n".join(turn.replies), when, line=turn.line,
                                  ref=f"claude-code:{result.session_id or '?'}:{turn.uuid}",
                                  max_record_chars=max_record_chars)
    (result.records if isinstance(built, ExchangeRecord) else result.rejected).append(built)
