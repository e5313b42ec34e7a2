"""Yak's own Markdown transcripts (``.md``), without any disk I/O: front matter naming the user and
the day, then ``User:`` and ``Assistant:`` blocks, each pair one exchange."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from yak_pipeline.core.exchanges import format_exchange
from yak_pipeline.core.types import InvalidUserId, validate_user_id
from yak_pipeline.ingestion.formats.exchange_records import (
    ExchangeRecord,
    FatalError,
    ParsedFile,
    RecordError,
    RejectedRecord,
    check_default_user,
    check_size,
    one_line,
    parse_timestamp,
)

_FRONT_MATTER_FENCE: Final = "---"
_FRONT_MATTER_LINE_RE: Final = re.compile(r"(?P<key>[A-Za-z_][A-Za-z0-9_-]*)\s*:\s*(?P<value>.*)")
_BLOCK_START_RE: Final = re.compile(r"(?P<role>User|Assistant):(?P<text>.*)")


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


def parse_markdown(text: str, max_record_chars: int, default_user: str | None) -> ParsedFile:
    """A transcript's text: every User block followed by an Assistant block is one exchange, dated
    by the front matter's ``date``; an unpaired block is rejected; no pair at all is fatal."""
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
        check_default_user(user_id, default_user)
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
