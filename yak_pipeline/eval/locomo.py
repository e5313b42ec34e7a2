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
  earlier turn of the same speaker sharing the most distinctive words with the update (see
  :func:`superseded_scores`), or nothing when none shares enough; it is a heuristic, so a file
  that knows its superseded turns should list them.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from yak_pipeline.core.exchanges import format_exchange
from yak_pipeline.core.query_intent import PRESENT_CUE, asks_about_present

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

# Derivation of superseded turns (see derive_superseded): only for a question about the present
# (core.query_intent, the reading recall uses too; not LoCoMo's "When …?" temporal questions).
# A question whether something still holds names the old value.
_STILL: Final = re.compile(r"\b(still|any ?more|any longer)\b", re.IGNORECASE)
# Ways of saying a value was given up; the words right after one name the old value.
_GIVEN_UP: Final = re.compile(
    r"\b(quit|quitting|stopped|stopping|gave up|given up|give up|giving up|sold|selling|left|leaving|"
    r"dropped|dropping|swapped|switched from|traded in|traded|pulled out of|no more|no longer|"
    r"bye bye|goodbye to|moved out of|moved from|split up with|broke up with|instead of|replaced|"
    r"got rid of|ditched)\b", re.IGNORECASE)
_CLAUSE_END: Final = re.compile(r"[.,;:!?()]")
_WORD: Final = re.compile(r"[^\W_]+")
# Function words, chat filler and number words; a content word is anything else of two or more
# letters that is not all digits.
_STOP_WORDS: Final[frozenset[str]] = frozenset("""
a about above after again against all also am an and any anyway are as at be because been before being
below between both but by can could did do does doing done don down during each even ever every few for
from further get gets getting go goes going gone got had has have having he her here hers herself him
himself his how i if in into is it its itself just ll me more most much my myself no nor not now of off
oh ok okay on once one only or other our ours ourselves out over own re really s same she should so some
still such t than that the their theirs them themselves then there these they this those though through
to too under until up us ve very was we were what when where which while who whom why will with would
yeah yes you your yours yourself yourselves d m
two three four five six seven eight nine ten eleven twelve twenty thirty forty fifty hundred thousand
first second third
january february march april may june july august september october november december
""".split())
# Words of the change itself ("I quit…", "I've started…", "someone new"): they say that a value
# changed, not which one, so two turns sharing them are not about the same fact.
_CHANGE_WORDS: Final[frozenset[str]] = frozenset("""
quit quitting stop stopped stopping give gave given giving sold sell selling left leave leaving drop
dropped dropping swap swapped switch switched trade traded pulled longer bye goodbye instead replaced
ditched rid new start started starting join joined move moved moving buy bought buying accept accepted
""".split())
_STEM_SUFFIXES: Final[tuple[str, ...]] = ("ies", "es", "s", "ed", "ing", "ly")
# Weights of a shared word (see superseded_scores).
GIVEN_UP_FACTOR: Final[float] = 2.0
QUESTION_FACTOR: Final[float] = 0.5
# A fact is usually named by a noun: a word shared only as a past-tense verb or an adverb
# ("signed", "landed", "officially") in either turn counts half.
WEAK_FACTOR: Final[float] = 0.5
# The best candidate's score must reach this (in units of within-conversation idf, ln(N/df)): a
# word in at most 1 turn of 20 weighs ln 20 = 3.0. Below it, two turns share only common words.
MIN_SUPERSEDED_WEIGHT: Final[float] = math.log(20)


def _stem(word: str) -> str:
    """A crude stem: one common suffix off, a doubled final consonant and a final ``e`` undone."""
    for suffix in _STEM_SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)] + ("y" if suffix == "ies" else "")
            break
    if len(word) >= 4 and word[-1] == word[-2] and word[-1] not in "aeiouls":
        word = word[:-1]
    if len(word) >= 4 and word.endswith("e"):
        word = word[:-1]
    return word


def _content_words(text: str) -> list[str]:
    return [_stem(w) for w in _WORD.findall(text.lower())
            if len(w) > 1 and not w.isdigit() and w not in _STOP_WORDS and w not in _CHANGE_WORDS]


def _weak_stems(text: str) -> frozenset[str]:
    """Stems that ``text`` only has as a past-tense verb or adverb ("signed", "officially")."""
    strong: set[str] = set()
    weak: set[str] = set()
    for w in _WORD.findall(text.lower()):
        if len(w) > 1 and not w.isdigit() and w not in _STOP_WORDS and w not in _CHANGE_WORDS:
            (weak if len(w) > 4 and w.endswith(("ed", "ly")) else strong).add(_stem(w))
    return frozenset(weak - strong)


def content_stems(text: str) -> frozenset[str]:
    """Stems of ``text``'s content words (lowercased; stop, number and change words dropped)."""
    return frozenset(_content_words(text))


def given_up_stems(text: str, *, words: int = 1) -> frozenset[str]:
    """Stems of the first content ``words`` after each "quit …", "sold the …", "no more …" in ``text``.

    ``"I sold the Fiat, I'm going to cycle in"`` gives ``{"fiat"}``: the value that was given up.
    """
    found: set[str] = set()
    for match in _GIVEN_UP.finditer(text):
        clause = _CLAUSE_END.split(text[match.end():], maxsplit=1)[0]
        found.update(_content_words(clause)[:words])
    return frozenset(found)


def _names(text: str) -> frozenset[str]:
    """Stems of the words ``text`` capitalises mid-sentence: names ("Hamilton", "East Legon")."""
    found: set[str] = set()
    for match in _WORD.finditer(text):
        word = match.group()
        before = text[: match.start()].rstrip()
        if word[0].isupper() and before and before[-1] not in ".!?":
            found.update(_content_words(word))
    return frozenset(found)


def superseded_scores(turns: Sequence[Turn], evidence: Iterable[str], question: str = "",
                      answer: str = "") -> dict[str, float]:
    """How strongly each earlier turn looks like the statement a knowledge update replaced.

    Candidates: the turns of the evidence turns' speaker(s) before the first evidence turn. A
    candidate scores, over the content-word stems it shares (lowercased, crude stemming; stop
    words, numbers, month names and words of change such as "quit", "sold", "new" dropped), each
    word's idf within the conversation (``ln(N / df)`` over all ``turns``) times a factor:

    - 2 for a word the evidence names as given up: the first content word after "quit", "sold
      the", "gave up", "no more", "left", "instead of" … ("I sold *the Fiat*"); in a question
      asking whether something *still* holds ("Do I still enjoy an after-work highball?") the
      question's words name the old value and count so too;
    - 1 for another word of the evidence, but 0 for a name (capitalised mid-sentence) that the
      ``answer`` repeats: that is the new value, and an earlier "we're looking at Hamilton"
      foreshadows it rather than stating the old one;
    - ½ for a word of the question: it names the fact asked about ("main form of exercise" finds
      "my main exercise is bouldering"), but "live" or "work" are common words;

    halved when the word is, in either turn, only a past-tense verb or an adverb ("signed",
    "officially"): facts are named by nouns. When the evidence names what was given up, a
    candidate must share one of those words or a word of the question, else it scores nothing.
    Only candidates with a positive score are returned.
    """
    wanted = set(evidence)
    order = {t.dia_id: i for i, t in enumerate(turns)}
    positions = sorted(order[e] for e in wanted if e in order)
    if not positions:
        return {}
    speakers = {turns[i].speaker for i in positions}
    stems = [content_stems(t.text) for t in turns]
    df = Counter(w for words in stems for w in words)
    n = len(turns)
    said = frozenset().union(*(stems[i] for i in positions))
    weak_in_evidence = frozenset().union(*(_weak_stems(turns[i].text) for i in positions))
    given_up = frozenset().union(*(given_up_stems(turns[i].text) for i in positions))
    asked = content_stems(PRESENT_CUE.sub(" ", question))
    if _STILL.search(question):
        given_up |= asked
    new_value = (content_stems(answer) & frozenset().union(*(_names(turns[i].text) for i in positions))) - given_up
    factors: dict[str, float] = {w: QUESTION_FACTOR for w in asked}
    for word in said | given_up:
        own = GIVEN_UP_FACTOR if word in given_up else 0.0 if word in new_value else 1.0
        factors[word] = max(own, factors.get(word, 0.0))
    required = given_up | asked if given_up else None
    scores: dict[str, float] = {}
    for i in range(positions[0]):
        if turns[i].speaker not in speakers or turns[i].dia_id in wanted:
            continue
        if required is not None and not stems[i] & required:
            continue
        weak = weak_in_evidence | _weak_stems(turns[i].text)
        score = sum(math.log(n / df[w]) * factors[w] * (WEAK_FACTOR if w in weak else 1.0)
                    for w in stems[i] if w in factors)
        if score > 0:
            scores[turns[i].dia_id] = score
    return scores


def derive_superseded(turns: Sequence[Turn], evidence: Iterable[str], question: str = "", answer: str = "",
                      *, min_weight: float = MIN_SUPERSEDED_WEIGHT) -> frozenset[str]:
    """The earlier turn a knowledge update replaced, guessed from the words alone; may be empty.

    The best-scoring candidate of :func:`superseded_scores` when its score reaches
    ``min_weight`` (one shared word found in at most one turn in 20), else nothing: a turn is
    labelled only when it shares a distinctive word. Ties go to the later turn (the value most
    recently stated before the change). The caller decides when a question is a knowledge update
    (see :func:`_parse_questions`).
    """
    scores = superseded_scores(turns, evidence, question, answer)
    if not scores:
        return frozenset()
    order = {t.dia_id: i for i, t in enumerate(turns)}
    best = max(scores, key=lambda d: (scores[d], order[d]))
    return frozenset({best}) if scores[best] >= min_weight else frozenset()


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
