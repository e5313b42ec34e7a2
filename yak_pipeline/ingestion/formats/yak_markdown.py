"""Yak's own Markdown transcripts (``.md``), without any disk I/O: front matter naming the user and
the day, then ``User:`` and ``Assistant:`` blocks, each pair one exchange."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Final

import yaml
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
from yak_pipeline.ingestion.formats.record_fields import Timestamp, UserId, validation_reason

_FRONT_MATTER_FENCE: Final = "---"
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
    read = FileRecords(max_record_chars)
    paired = False
    index = 0
    while index < len(blocks):
        block = blocks[index]
        reply = blocks[index + 1] if index + 1 < len(blocks) else None
        if block.role == "User" and reply is not None and reply.role == "Assistant":
            paired = True
            read.read(block.line, f"{block.raw}\n{reply.raw}",
                      partial(_markdown_record, user_id, occurred_at, block, reply))
            index += 2
            continue
        reason = (
            "User block has no Assistant block after it"
            if block.role == "User"
            else "Assistant block has no User block before it"
        )
        read.reject(block.line, block.raw, reason)
        index += 1
    if not paired:
        first_line = blocks[0].line if blocks else min(body_start + 1, len(lines))
        raise FatalError(first_line, "no exchange found: expected a 'User:' block followed by an 'Assistant:' block")
    return read.parsed()


class _FrontMatter(BaseModel):
    """The two keys a transcript's front matter must give (``user_id`` may come from ``default_user``);
    any other YAML in it is allowed and ignored."""

    model_config = ConfigDict(extra="ignore")

    user_id: UserId = None
    date: Timestamp


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
    values, key_lines = _front_matter_values("\n".join(lines[opening + 1 : closing]), first_line=opening + 2)
    try:
        front = _FrontMatter.model_validate(values)
    except ValidationError as error:
        first = error.errors(include_url=False, include_context=False, include_input=False)[0]
        key = str(first["loc"][0])
        if first["type"] == "missing":
            raise FatalError(closing + 1, f"front matter has no {key}") from None
        raise FatalError(key_lines[key], validation_reason(error)) from None
    try:
        user_id = record_user(front.user_id, default_user)
    except RecordError as error:
        reason = str(error) if front.user_id is not None else "front matter has no user_id"
        raise FatalError(key_lines.get("user_id", closing + 1), reason) from None
    return user_id, front.date, closing + 1


def _front_matter_values(text: str, *, first_line: int) -> tuple[dict[str, object], dict[str, int]]:
    """The front matter's top-level keys (lower case) with their values, and the line each key is on.

    The text is read as YAML by PyYAML's safe loader (what ``yaml.safe_load`` does), keeping the
    node tree for the lines. A scalar's value is its text as written: YAML's implicit types would
    turn a user id like ``0042`` into a number and ``yes`` into true; a date string is read by the
    same ISO-8601 check as a JSON record's ``occurred_at``.
    """
    try:
        root, document = _yaml_document(text)
    except yaml.reader.ReaderError as error:  # a control character, before any parsing
        line = first_line + text.count("\n", 0, error.position)
        raise FatalError(line, f"front matter is not valid YAML: {error.reason} (#x{error.character:04x})") from None
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = first_line + (mark.line if mark is not None else 0)
        raise FatalError(line, f"front matter is not valid YAML: {error.problem or error.context}") from None
    except yaml.YAMLError as error:
        raise FatalError(first_line, f"front matter is not valid YAML: {error}") from None
    except RecursionError:
        raise FatalError(first_line, "front matter is not valid YAML: nested too deep") from None
    if root is None:
        return {}, {}
    if not isinstance(root, yaml.MappingNode):
        raise FatalError(first_line, f"front matter must be 'key: value' lines, got {json_kind(document)}")
    values: dict[str, object] = {}
    key_lines: dict[str, int] = {}
    for key_node, value_node in root.value:
        if not isinstance(key_node, yaml.ScalarNode):
            continue
        key, line = key_node.value.lower(), first_line + key_node.start_mark.line
        if key in key_lines:
            raise FatalError(line, f"front matter gives {key} twice (first on line {key_lines[key]})")
        key_lines[key] = line
        # A list or a mapping stands in empty: a key that must be text only reports its kind.
        values[key] = (value_node.value if isinstance(value_node, yaml.ScalarNode)
                       else [] if isinstance(value_node, yaml.SequenceNode) else {})
    return values, key_lines


def _yaml_document(text: str) -> tuple[yaml.Node | None, object]:
    """The YAML document's node tree (None when empty) and its value as ``yaml.safe_load`` loads it,
    so whatever the safe loader refuses (an unknown tag, say) is refused here too."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        return root, loader.construct_document(root) if root is not None else None
    finally:
        loader.dispose()


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


def _markdown_record(user_id: str, occurred_at: datetime, user_block: _Block, assistant_block: _Block) -> ExchangeRecord:
    user, assistant = user_block.text, assistant_block.text
    if not user:
        raise RecordError("User block is empty")
    if not assistant:
        raise RecordError("Assistant block is empty")
    return ExchangeRecord(user_id, format_exchange(user, assistant), occurred_at, user_block.line)
