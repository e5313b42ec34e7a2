"""Reading LoCoMo-format files (Maharana et al., 2024) and mapping their turns to Yak exchanges.

The format: a JSON list of conversations, each with

- ``conversation``: ``speaker_a``, ``speaker_b``, and per session N a list ``session_N`` of turns
  ``{speaker, dia_id, text}`` (optionally ``blip_caption`` when the turn shares a photo) and its
  ``session_N_date_time`` such as ``"1:56 pm on 8 May, 2023"``;
- ``qa``: questions with ``question``, ``evidence`` (turn ids such as ``"D1:3"``) and ``category``
  1–4 (5 = adversarial, unanswerable: left out of retrieval scores);
- ``sample_id`` (optional; the conversation's index stands in).

How a turn becomes an exchange (one memory per turn, dated by its session): the turn's text is
the user's part, and the assistant's part names who said it::

    User: I went to a LGBTQ support group yesterday and it was so powerful.
    Assistant: (Caroline said this.)

A LoCoMo turn is one person speaking, not a user/assistant pair; putting the words in the user's
part lets the distiller read them as first-person statements, and naming the speaker keeps who
said it in the raw exchange (both people of a conversation are one Yak user). A turn that shares
a photo gets its caption appended, ``[shares a photo: a photo of a dog …]``, as LoCoMo's own
retrieval baselines do; image URLs and search queries are not used.

Questions' evidence ids are read leniently (``"D8:6; D9:17"`` is two ids, ``"D:11:26"`` is
``D11:26``); ids that name no turn are counted and dropped, and a question left without evidence
is skipped (and counted). Any file of this shape works; anything else is a
:class:`LocomoFormatError` with one line saying where.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Final

from yak_pipeline.core.exchanges import format_exchange

SCORED_CATEGORIES: Final[tuple[int, ...]] = (1, 2, 3, 4)
ADVERSARIAL_CATEGORY: Final[int] = 5
# The common reading of the released data's category numbers (their counts match the paper's).
CATEGORY_NAMES: Final[dict[int, str]] = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop",
                                         5: "adversarial"}

_SESSION_KEY: Final = re.compile(r"^session_(\d+)$")
_EVIDENCE_ID: Final = re.compile(r"D:?(\d+):(\d+)")
_DATE_FORMATS: Final[tuple[str, ...]] = ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%I:%M %p on %B %d, %Y")


class LocomoFormatError(ValueError):
    """The file is not in LoCoMo format; the message says where and what."""


@dataclass(frozen=True)
class Turn:
    """One turn of a conversation: its id (``D1:3``), speaker, text and session time (UTC)."""

    dia_id: str
    speaker: str
    text: str
    occurred_at: datetime
    caption: str | None = None

    def exchange(self) -> str:
        """The turn as a Yak exchange (see the module docstring for why this form)."""
        said = self.text.strip() or "(no words)"
        if self.caption:
            said = f"{said} [shares a photo: {self.caption.strip()}]"
        return format_exchange(said, f"({self.speaker} said this.)")


@dataclass(frozen=True)
class Question:
    """A scored question: its text, category and the turns that answer it."""

    question: str
    category: int
    evidence: frozenset[str]


@dataclass(frozen=True)
class Conversation:
    """One conversation: its turns in order and its scored questions."""

    sample_id: str
    speakers: tuple[str, str]
    turns: tuple[Turn, ...]
    questions: tuple[Question, ...]
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def last_session_at(self) -> datetime:
        """When the conversation's last session took place."""
        return max(t.occurred_at for t in self.turns)


def parse_session_datetime(value: str) -> datetime:
    """``"1:56 pm on 8 May, 2023"`` as an aware UTC datetime (LoCoMo gives no time zone)."""
    text = " ".join(str(value).split())
    for fmt in _DATE_FORMATS:
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
    raise ValueError(f"unreadable session date/time {value!r} (expected e.g. '1:56 pm on 8 May, 2023')")


def parse_evidence(items: object) -> list[str]:
    """Turn ids named by a question's ``evidence`` list, normalised to ``D<session>:<turn>``."""
    if items is None:
        return []
    if isinstance(items, str):
        items = [items]
    if not isinstance(items, list):
        raise ValueError(f"evidence must be a list of turn ids, got {type(items).__name__}")
    ids: list[str] = []
    for item in items:
        for session, turn in _EVIDENCE_ID.findall(str(item)):
            ids.append(f"D{int(session)}:{int(turn)}")
    return ids


def _require(obj: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise LocomoFormatError(f"{where}: missing {key!r}")
    value = obj[key]
    if not isinstance(value, kind):
        raise LocomoFormatError(f"{where}: {key!r} must be a {kind.__name__}, got {type(value).__name__}")
    return value


def _parse_turns(conversation: dict, where: str) -> list[Turn]:
    sessions = sorted(
        (int(m.group(1)), key) for key in conversation if (m := _SESSION_KEY.match(key))
    )
    if not sessions:
        raise LocomoFormatError(f"{where}: no session_N lists in 'conversation'")
    turns: list[Turn] = []
    seen: set[str] = set()
    for number, key in sessions:
        session = conversation[key]
        if not isinstance(session, list):
            raise LocomoFormatError(f"{where}.{key}: must be a list of turns")
        if not session:
            continue
        stamp_key = f"{key}_date_time"
        if stamp_key not in conversation:
            raise LocomoFormatError(f"{where}: {key} has no {stamp_key}")
        try:
            when = parse_session_datetime(conversation[stamp_key])
        except ValueError as exc:
            raise LocomoFormatError(f"{where}.{stamp_key}: {exc}") from None
        for index, turn in enumerate(session):
            at = f"{where}.{key}[{index}]"
            speaker = _require(turn, "speaker", str, at)
            dia_id = _require(turn, "dia_id", str, at)
            text = _require(turn, "text", str, at)
            normal = parse_evidence([dia_id])
            if len(normal) != 1:
                raise LocomoFormatError(f"{at}: dia_id {dia_id!r} is not like 'D{number}:1'")
            if normal[0] in seen:
                raise LocomoFormatError(f"{at}: dia_id {dia_id!r} appears twice")
            seen.add(normal[0])
            caption = turn.get("blip_caption")
            turns.append(Turn(dia_id=normal[0], speaker=speaker.strip() or "someone", text=text,
                              occurred_at=when, caption=caption if isinstance(caption, str) and caption.strip() else None))
    if not turns:
        raise LocomoFormatError(f"{where}: the conversation has no turns")
    return turns


def _parse_questions(qa: list, turn_ids: set[str], where: str) -> tuple[list[Question], dict[str, int]]:
    questions: list[Question] = []
    skipped = {"adversarial": 0, "other_category": 0, "no_evidence": 0, "unknown_evidence_ids": 0}
    for index, item in enumerate(qa):
        at = f"{where}.qa[{index}]"
        text = _require(item, "question", str, at)
        category = item.get("category")
        if isinstance(category, bool) or not isinstance(category, int):
            raise LocomoFormatError(f"{at}: 'category' must be an integer 1-5")
        if category == ADVERSARIAL_CATEGORY:
            skipped["adversarial"] += 1
            continue
        if category not in SCORED_CATEGORIES:
            skipped["other_category"] += 1
            continue
        try:
            ids = parse_evidence(item.get("evidence"))
        except ValueError as exc:
            raise LocomoFormatError(f"{at}: {exc}") from None
        known = {i for i in ids if i in turn_ids}
        skipped["unknown_evidence_ids"] += len(set(ids) - known)
        if not known or not text.strip():
            skipped["no_evidence"] += 1
            continue
        questions.append(Question(question=text, category=category, evidence=frozenset(known)))
    return questions, skipped


def parse_locomo(data: object, *, limit_conversations: int | None = None) -> list[Conversation]:
    """Conversations from parsed LoCoMo JSON, or :class:`LocomoFormatError` naming the problem."""
    if not isinstance(data, list):
        raise LocomoFormatError("top level must be a list of conversations")
    if not data:
        raise LocomoFormatError("the file holds no conversations")
    chosen: Sequence = data if limit_conversations is None else data[:limit_conversations]
    conversations = []
    for index, item in enumerate(chosen):
        where = f"conversation {index}"
        if not isinstance(item, dict):
            raise LocomoFormatError(f"{where}: must be an object")
        conversation = _require(item, "conversation", dict, where)
        qa = _require(item, "qa", list, where)
        turns = _parse_turns(conversation, where)
        questions, skipped = _parse_questions(qa, {t.dia_id for t in turns}, where)
        speakers = (str(conversation.get("speaker_a", "")), str(conversation.get("speaker_b", "")))
        sample_id = str(item.get("sample_id") or f"conversation-{index}")
        conversations.append(Conversation(sample_id=sample_id, speakers=speakers, turns=tuple(turns),
                                          questions=tuple(questions), skipped=skipped))
    return conversations


def load_locomo(path: Path, *, limit_conversations: int | None = None) -> list[Conversation]:
    """Read and parse a LoCoMo-format file; any problem is a one-line :class:`LocomoFormatError`."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise LocomoFormatError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise LocomoFormatError(f"{path}: is a directory, not a LoCoMo JSON file") from None
    except OSError as exc:
        raise LocomoFormatError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        data = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise LocomoFormatError(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise LocomoFormatError(f"{path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    try:
        return parse_locomo(data, limit_conversations=limit_conversations)
    except LocomoFormatError as exc:
        raise LocomoFormatError(f"{path}: {exc}") from None
