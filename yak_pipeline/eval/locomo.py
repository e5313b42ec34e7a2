"""Reading LoCoMo-format files (Maharana et al., 2024) and mapping their turns to Yak exchanges.

The format: a JSON list of conversations, each with

- ``conversation``: ``speaker_a``, ``speaker_b``, and per session N a list ``session_N`` of turns
  ``{speaker, dia_id, text}`` (optionally ``blip_caption`` when the turn shares a photo) and its
  ``session_N_date_time`` such as ``"1:56 pm on 8 May, 2023"``;
- ``qa``: questions with ``question``, ``evidence`` (turn ids such as ``"D1:3"``) and ``category``
  1–4 (5 = adversarial, unanswerable: left out of retrieval scores; a 5 with no evidence at all
  is a never-said question, kept apart, see below);
- ``sample_id`` (optional; the conversation's index stands in).

How turns become exchanges depends on who speaks.

**A user and an assistant** (the second speaker, ``speaker_b``, is named ``Assistant``, compared
case-insensitively with surrounding spaces ignored; the paraphrase set and BEAM): the
conversation is stored as Yak stores a chat, as the proxy and the importers do. Each turn of the
first speaker and the assistant's reply that follows it in the same session become one exchange,
``format_exchange(user_text, assistant_text)``, dated by the session (:meth:`Conversation.exchanges`).
The exchange holds both turns' ids; evidence is always the user's turn, so the assistant's id is
only there to be complete. A user turn with no reply gets the assistant part ``(no reply)``; two
replies in a row both go into the exchange's assistant part; an assistant turn that opens a
session (no user turn before it) is an exchange of its own whose user part is ``(no words)``.

**Two people** (LoCoMo; anyone else): one exchange per turn, dated by its session; the turn's
text is the user's part, and the assistant's part names who said it::

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

Two extras for measures beyond ranking quality:

- **Never-said questions.** A category-5 question whose ``evidence`` is empty (or absent) asks about
  something the conversation never mentions (the paraphrase set's category 5). It is not scored
  with the ranking metrics but kept in :attr:`Conversation.never_said`, so a method can be checked
  for returning nothing (:func:`yak_pipeline.eval.metrics.abstained`). LoCoMo's own category-5
  questions are *adversarial*: they do list evidence, stay out of both lists and are counted in
  ``skipped["adversarial"]`` as before. (``skipped`` keeps its keys; the never-said count is
  ``len(conversation.never_said)``.)
- **Superseded turns.** For a knowledge-update question (the person changed a fact; the evidence
  is only the newer statement) :attr:`Question.superseded` names the earlier turn that stated the
  old value, for :func:`yak_pipeline.eval.metrics.current_first`. An explicit list on the qa item
  (``superseded``, ``superseded_evidence`` or ``old_evidence``, read like ``evidence``) is used as
  given, for any category. Otherwise it is derived from the words alone, for category 2 only and
  only when the question asks about the present ("Which town do I live in now?"): category 2 is
  "knowledge update" in the paraphrase set but "temporal" in LoCoMo ("When did …?", "How long
  …?"), where an earlier turn replaced by the evidence means nothing. The derived label is the
  earlier turn of the same speaker sharing the most distinctive words with the update
  (``eval.superseded``), or nothing when none shares enough; it is a heuristic, so a file that
  knows its superseded turns should list them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from yak_pipeline.core.exchanges import format_exchange
from yak_pipeline.core.query_intent import asks_about_present
from yak_pipeline.eval.superseded import derive_superseded

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

    def said(self) -> str:
        """The turn's words, with a shared photo's caption appended (``(no words)`` when empty)."""
        said = self.text.strip() or "(no words)"
        if self.caption:
            said = f"{said} [shares a photo: {self.caption.strip()}]"
        return said

    def exchange(self) -> str:
        """The turn as a Yak exchange of its own (two people talking; see the module docstring)."""
        return format_exchange(self.said(), f"({self.speaker} said this.)")

    @property
    def session(self) -> str:
        """The session part of the turn's id (``D3`` of ``D3:7``)."""
        return self.dia_id.split(":", 1)[0]


ASSISTANT_SPEAKER: Final[str] = "assistant"
NO_REPLY: Final[str] = "(no reply)"
NO_WORDS: Final[str] = "(no words)"


def is_assistant(name: str) -> bool:
    """Whether a speaker name is the assistant's: ``Assistant``, in any case, spaces around ignored."""
    return name.strip().casefold() == ASSISTANT_SPEAKER


@dataclass(frozen=True)
class Exchange:
    """One exchange as the evaluation stores it: its text, when, and the turns it holds.

    ``dia_ids`` lists the user's turn first (the one evidence can name), then any reply's.
    """

    content: str
    occurred_at: datetime
    dia_ids: tuple[str, ...]


@dataclass(frozen=True)
class Question:
    """A question: its text, category, the turns that answer it and the turns it supersedes.

    ``superseded`` (knowledge updates only, else empty) holds earlier turns that stated the value
    the evidence replaced; ``evidence`` is empty only for a never-said question. ``ability`` is
    the memory ability the question probes, when the file names it (the converted BEAM file's
    ``ability``: instruction_following, temporal_reasoning, …); None otherwise.
    """

    question: str
    category: int
    evidence: frozenset[str]
    superseded: frozenset[str] = frozenset()
    ability: str | None = None


@dataclass(frozen=True)
class Conversation:
    """One conversation: its turns in order, its scored questions and its never-said questions."""

    sample_id: str
    speakers: tuple[str, str]
    turns: tuple[Turn, ...]
    questions: tuple[Question, ...]
    skipped: dict[str, int] = field(default_factory=dict)
    never_said: tuple[Question, ...] = ()

    @property
    def last_session_at(self) -> datetime:
        """When the conversation's last session took place."""
        return max(t.occurred_at for t in self.turns)

    @property
    def with_assistant(self) -> bool:
        """Whether this is a user talking to an assistant: ``speaker_b`` is ``Assistant`` (:func:`is_assistant`)."""
        return is_assistant(self.speakers[1])

    def exchanges(self) -> tuple[Exchange, ...]:
        """The conversation as Yak exchanges, in order (the module docstring says how)."""
        if not self.with_assistant:
            return tuple(Exchange(t.exchange(), t.occurred_at, (t.dia_id,)) for t in self.turns)
        assistant = self.speakers[1]
        out: list[Exchange] = []
        user: Turn | None = None  # the user turn whose reply is being gathered
        replies: list[Turn] = []

        def close() -> None:
            if user is not None:
                reply = "\n\n".join(r.text.strip() for r in replies if r.text.strip()) or NO_REPLY
                out.append(Exchange(format_exchange(user.said(), reply), user.occurred_at,
                                    (user.dia_id, *(r.dia_id for r in replies))))
            elif replies:  # the assistant opened the session
                reply = "\n\n".join(r.text.strip() for r in replies if r.text.strip()) or NO_REPLY
                out.append(Exchange(format_exchange(NO_WORDS, reply), replies[0].occurred_at,
                                    tuple(r.dia_id for r in replies)))

        for turn in self.turns:
            opener = user or (replies[0] if replies else None)
            if opener is not None and turn.session != opener.session:
                close()
                user, replies = None, []
            if turn.speaker == assistant or is_assistant(turn.speaker):
                replies.append(turn)
                continue
            close()
            user, replies = turn, []
        close()
        return tuple(out)


def parse_session_datetime(value: str) -> datetime:
    """``"1:56 pm on 8 May, 2023"`` as an aware UTC datetime (LoCoMo gives no time zone)."""
    text = " ".join(str(value).split())
    for fmt in _DATE_FORMATS:
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=UTC)
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


SUPERSEDED_FIELDS: Final[tuple[str, ...]] = ("superseded", "superseded_evidence", "old_evidence")
KNOWLEDGE_UPDATE_CATEGORY: Final[int] = 2


def _parse_questions(qa: list, turns: Sequence[Turn], where: str) -> tuple[list[Question], list[Question], dict[str, int]]:
    """Scored questions, never-said questions and the counts of what was left out.

    ``superseded``: an explicit list on the item (``superseded``, ``superseded_evidence`` or
    ``old_evidence``; an empty list means none) wins, with unknown ids counted like evidence ids
    and ids also in the evidence dropped; otherwise it is derived (with the item's ``answer``)
    for category 2 only when the question asks about the present, so LoCoMo's "When did …?"
    questions are never labelled.
    """
    turn_ids = {t.dia_id for t in turns}
    questions: list[Question] = []
    never_said: list[Question] = []
    skipped = {"adversarial": 0, "other_category": 0, "no_evidence": 0, "unknown_evidence_ids": 0}
    for index, item in enumerate(qa):
        at = f"{where}.qa[{index}]"
        text = _require(item, "question", str, at)
        ability = item.get("ability")
        if ability is not None and (not isinstance(ability, str) or not ability.strip()):
            raise LocomoFormatError(f"{at}: 'ability' must be a non-empty string when given")
        ability = ability.strip() if ability else None
        category = item.get("category")
        if isinstance(category, bool) or not isinstance(category, int):
            raise LocomoFormatError(f"{at}: 'category' must be an integer 1-5")
        if category == ADVERSARIAL_CATEGORY:
            # Never said: no evidence at all. LoCoMo's adversarial questions list the turns they twist.
            if not item.get("evidence") and text.strip():
                never_said.append(Question(question=text, category=category, evidence=frozenset(), ability=ability))
            else:
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
        explicit = next((f for f in SUPERSEDED_FIELDS if item.get(f) is not None), None)
        if explicit is not None:
            try:
                old = parse_evidence(item[explicit])
            except ValueError as exc:
                raise LocomoFormatError(f"{at}: {explicit}: {exc}") from None
            skipped["unknown_evidence_ids"] += len(set(old) - turn_ids)
            superseded = frozenset(i for i in old if i in turn_ids) - known
        elif category == KNOWLEDGE_UPDATE_CATEGORY and asks_about_present(text):
            answer = item.get("answer")
            superseded = derive_superseded(turns, known, text, answer if isinstance(answer, str) else "")
        else:
            superseded = frozenset()
        questions.append(Question(question=text, category=category, evidence=frozenset(known),
                                  superseded=superseded, ability=ability))
    return questions, never_said, skipped


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
        questions, never_said, skipped = _parse_questions(qa, turns, where)
        speakers = (str(conversation.get("speaker_a", "")), str(conversation.get("speaker_b", "")))
        sample_id = str(item.get("sample_id") or f"conversation-{index}")
        conversations.append(Conversation(sample_id=sample_id, speakers=speakers, turns=tuple(turns),
                                          questions=tuple(questions), skipped=skipped,
                                          never_said=tuple(never_said)))
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
