"""The exchanges of one conversation of a Claude.ai data export (``conversations.json``), without I/O.

Each conversation has a ``uuid``, a ``name`` and ``chat_messages``: messages with a ``sender``
(``human`` or ``assistant``), a ``created_at`` (ISO-8601), the plain ``text`` and the ``content``
blocks it was made of (``text``, and ``thinking``, ``tool_use``, ``tool_result`` for reasoning and
tools). A human message followed by the assistant's is one exchange, dated by the human
message. Only ``text`` blocks are read (the plain ``text`` when a message has no blocks);
attachments' extracted text is a document, not something said, and is left out.

Exports that keep edited branches give each message a ``parent_message_uuid`` and the
conversation a ``current_leaf_message_uuid``: then only the branch ending there is read, as in
the ChatGPT export. A prompt with no text answer, or an answer with no prompt, is skipped.
"""

from __future__ import annotations

from yak_pipeline.ingestion.formats.exchange_records import (
    ConversationExchanges,
    RecordError,
    build_exchange_record,
    conversation_part,
    parse_timestamp,
)


def is_claude_conversation(value: object) -> bool:
    """Whether ``value`` looks like one Claude.ai conversation (it has ``chat_messages``)."""
    return isinstance(value, dict) and isinstance(value.get("chat_messages"), list)


def claude_exchanges(conversation: object, *, user_id: str, item: int, max_record_chars: int) -> ConversationExchanges:
    """The exchanges of one conversation; :class:`RecordError` if it is broken as a whole.

    ``item`` is the conversation's position in the export (1-based), the ``line`` of its records.
    """
    conversation, messages = conversation_part(conversation, "chat_messages", list, "chat_messages list")
    uuid = conversation.get("uuid")
    conversation_id = uuid if isinstance(uuid, str) else f"item{item}"
    result = ConversationExchanges([], [], 0)
    prompt: tuple[dict, str] | None = None  # the open prompt: its message and text
    replies: list[str] = []
    for message in _branch(conversation, messages):
        sender, text = _message_text(message)
        if sender == "human" and text:
            _close(result, prompt, replies, user_id, conversation_id, item, max_record_chars)
            prompt, replies = (message, text), []
        elif sender == "assistant" and text:
            if prompt is None:
                result.skipped += 1
            else:
                replies.append(text)
    _close(result, prompt, replies, user_id, conversation_id, item, max_record_chars)
    return result


def _close(result: ConversationExchanges, prompt: tuple[dict, str] | None, replies: list[str], user_id: str,
           conversation_id: str, item: int, max_record_chars: int) -> None:
    """Turn the open prompt and its replies into an exchange (or a skipped turn)."""
    if prompt is None:
        return
    if not replies:
        result.skipped += 1
        return
    message, text = prompt
    if "created_at" not in message:
        raise RecordError(f"message {message.get('uuid', '?')} has no created_at")
    when = parse_timestamp(message["created_at"], "created_at")
    built = build_exchange_record(user_id, text, "\n\n".join(replies), when, line=item,
                                  ref=f"claude:{conversation_id}:{message.get('uuid', '')}",
                                  max_record_chars=max_record_chars)
    result.add(built)


def _branch(conversation: dict, messages: list) -> list[dict]:
    """The messages in conversation order: the current branch when the export records branches."""
    objects = [m for m in messages if isinstance(m, dict)]
    if len(objects) != len(messages):
        raise RecordError("chat_messages holds something that is not a message object")
    leaf = conversation.get("current_leaf_message_uuid")
    by_id = {m.get("uuid"): m for m in objects if isinstance(m.get("uuid"), str)}
    if not isinstance(leaf, str) or leaf not in by_id or not any("parent_message_uuid" in m for m in objects):
        return objects
    branch: list[dict] = []
    seen: set[str] = set()
    node: object = leaf
    while isinstance(node, str) and node in by_id:
        if node in seen:
            raise RecordError(f"the parent links loop at message {node}")
        seen.add(node)
        branch.append(by_id[node])
        node = by_id[node].get("parent_message_uuid")
    branch.reverse()
    return branch


def _message_text(message: dict) -> tuple[object, str]:
    """``(sender, text)``: the message's text blocks joined, or its plain ``text``."""
    sender = message.get("sender")
    blocks = message.get("content")
    if isinstance(blocks, list) and blocks:
        texts = [b["text"] for b in blocks if isinstance(b, dict) and b.get("type") == "text"
                 and isinstance(b.get("text"), str)]
        return sender, "\n\n".join(t.strip() for t in texts if t.strip())
    text = message.get("text")
    return sender, text.strip() if isinstance(text, str) else ""
