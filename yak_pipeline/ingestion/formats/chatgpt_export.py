"""The exchanges of one conversation of a ChatGPT data export (``conversations.json``), without I/O.

A ChatGPT conversation is a tree: ``mapping`` holds every node (``id``, ``message``, ``parent``,
``children``), because each edited prompt or regenerated answer starts a new branch. The branch
the person last saw ends at ``current_node``; following ``parent`` links from there to the root
and reversing gives the conversation as it stands, and only that branch is read.

On it, each user message with text followed by the assistant's text messages up to the next
user message is one exchange, dated by the user message's ``create_time`` (Unix seconds). What
is not conversation is left out and counted as skipped where it would have been an exchange:
system and tool messages, the assistant's calls to tools (``recipient`` other than ``all``),
hidden messages (custom instructions, memory updates), non-text content (code run by tools,
browsing results, reasoning), and a prompt that got no text answer.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from yak_pipeline.ingestion.formats.exchange_records import (
    ConversationExchanges,
    RecordError,
    build_exchange_record,
    conversation_part,
    json_kind,
)

# Content types whose parts are what a person reads; the others are tool traffic and reasoning.
# U+E200 opens a marker, U+E201 closes it, U+E202 separates its fields ("cite", "turn0search3", …).
_CITATION_SPAN_RE: Final = re.compile(r"\ue200(?:cite|filecite|navlist|image_group|video|i)\b[^\ue201]*\ue201?")
_MARKED_SPAN_RE: Final = re.compile(r"\ue200[a-z_]*\ue202?([^\ue200\ue201]*)\ue201")
_PRIVATE_USE_RE: Final = re.compile(r"[\ue200-\ue2ff]")
_TEXT_CONTENT_TYPES: Final = frozenset({"text", "multimodal_text"})


@dataclass
class _Turn:
    prompt: str
    prompt_id: str
    when: datetime | None
    replies: list[str]


def is_chatgpt_conversation(value: object) -> bool:
    """Whether ``value`` looks like one ChatGPT conversation (a ``mapping`` of message nodes)."""
    return isinstance(value, dict) and isinstance(value.get("mapping"), dict)


def chatgpt_exchanges(conversation: object, *, user_id: str, item: int,
                      max_record_chars: int) -> ConversationExchanges:
    """The exchanges of the current branch of one conversation; :class:`RecordError` if it is broken.

    ``item`` is the conversation's position in the export (1-based), the ``line`` of its records.
    """
    conversation, mapping = conversation_part(conversation, "mapping", dict, "mapping of messages")
    conversation_id = _text_field(conversation, "conversation_id") or _text_field(conversation, "id") or f"item{item}"
    fallback_time = _epoch(conversation.get("create_time"), "create_time")
    turns: list[_Turn] = []
    skipped = 0
    for message in _current_branch(conversation, mapping):
        role, text = _message_text(message)
        if role == "user" and text:
            turns.append(_Turn(text, _text_field(message, "id") or "", _epoch(message.get("create_time"),
                                                                              "create_time"), []))
        elif role == "assistant" and text:
            if turns:
                turns[-1].replies.append(text)
                turns[-1].when = turns[-1].when or _epoch(message.get("create_time"), "create_time")
            else:
                skipped += 1  # a greeting before any prompt (custom GPTs open with one)
    result = ConversationExchanges([], [], skipped)
    for turn in turns:
        if not turn.replies:
            result.skipped += 1
            continue
        when = turn.when or fallback_time
        if when is None:
            raise RecordError(f"message {turn.prompt_id or '?'} has no create_time, nor has the conversation")
        built = build_exchange_record(user_id, turn.prompt, "\n\n".join(turn.replies), when, line=item,
                                      ref=f"chatgpt:{conversation_id}:{turn.prompt_id}",
                                      max_record_chars=max_record_chars)
        result.add(built)
    return result


def _current_branch(conversation: dict, mapping: dict) -> list[dict]:
    """The messages from the root to ``current_node``, in order."""
    node_id = conversation.get("current_node")
    if node_id is None:
        raise RecordError("conversation has no current_node")
    messages: list[dict] = []
    seen: set[str] = set()
    while node_id is not None:
        if not isinstance(node_id, str):
            raise RecordError(f"a parent link is {json_kind(node_id)}, not a node id")
        if node_id in seen:
            raise RecordError(f"the parent links loop at node {node_id}")
        seen.add(node_id)
        node = mapping.get(node_id)
        if not isinstance(node, dict):
            raise RecordError(f"the current branch reaches node {node_id}, which the mapping lacks")
        message = node.get("message")
        if isinstance(message, dict):
            messages.append(message)
        node_id = node.get("parent")
    messages.reverse()
    return messages


def _message_text(message: dict) -> tuple[str | None, str]:
    """``(role, text)`` of a message a person reads; text is empty for tool traffic and hidden messages."""
    author = message.get("author")
    role = author.get("role") if isinstance(author, dict) else None
    metadata = message.get("metadata")
    if isinstance(metadata, dict) and metadata.get("is_visually_hidden_from_conversation"):
        return role, ""
    if role == "assistant" and message.get("recipient", "all") != "all":
        return role, ""  # a call to a tool (python, browser, dalle), not an answer
    content = message.get("content")
    if not isinstance(content, dict) or content.get("content_type") not in _TEXT_CONTENT_TYPES:
        return role, ""
    parts = content.get("parts")
    if not isinstance(parts, list):
        return role, ""
    # Images and files are dicts (asset pointers); only the text parts are kept.
    return role, without_citation_markers("\n".join(part for part in parts if isinstance(part, str))).strip()


def without_citation_markers(text: str) -> str:
    """``text`` without ChatGPT's inline markers: private-use characters (U+E200…U+E2FF) around
    ``cite turn0search3``-style references, which the app draws as links and an export keeps as text.

    A citation, file citation or link list is dropped whole (it names a search result, not a word
    said); any other marked span (an entity) keeps its text; stray markers go.
    """
    text = _CITATION_SPAN_RE.sub("", text)
    text = _MARKED_SPAN_RE.sub(_shown_text, text)
    text = _PRIVATE_USE_RE.sub("", text)
    return re.sub(r"[ \t]+([.,;:!?)])", r"\1", text)


def _shown_text(span: re.Match[str]) -> str:
    """What a marked span shows: an entity's name (``["city", "Lyon", …]`` → ``Lyon``), else its text."""
    inner = span.group(1)
    try:
        fields = json.loads(inner)
    except ValueError:
        return inner
    if isinstance(fields, list) and len(fields) > 1 and isinstance(fields[1], str):
        return fields[1]
    return inner


def _text_field(value: dict, key: str) -> str | None:
    field = value.get(key)
    return field if isinstance(field, str) and field else None


def _epoch(value: object, name: str) -> datetime | None:
    """A ``create_time`` (Unix seconds, a float) as UTC; None when absent; RecordError when malformed."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RecordError(f"{name} must be Unix seconds, got {json_kind(value)}")
    try:
        return datetime.fromtimestamp(value, UTC)
    except (OverflowError, OSError, ValueError):
        raise RecordError(f"{name} {value!r} is not a time") from None
