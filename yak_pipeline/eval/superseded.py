"""Guessing which earlier turn a knowledge update replaced, from the words alone.

A knowledge-update question (the person changed a fact; the evidence is only the newer
statement) is scored for "current first" (:func:`yak_pipeline.eval.metrics.current_first`)
against the earlier turn that stated the old value. When a file does not list that turn,
``eval.locomo`` derives it here (:func:`derive_superseded`): the earlier turn of the same speaker
sharing the most distinctive words with the update, or nothing when none shares enough. It is a
heuristic, so a file that knows its superseded turns should list them.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Final

from yak_pipeline.core.query_intent import PRESENT_CUE

if TYPE_CHECKING:  # eval.locomo imports this module to label its questions
    from yak_pipeline.eval.locomo import Turn

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
    """Stems of ``text``'s content words in order, repeats kept (see :func:`content_stems`)."""
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
    (``eval.locomo``'s ``_parse_questions``).
    """
    scores = superseded_scores(turns, evidence, question, answer)
    if not scores:
        return frozenset()
    order = {t.dia_id: i for i, t in enumerate(turns)}
    best = max(scores, key=lambda d: (scores[d], order[d]))
    return frozenset({best}) if scores[best] >= min_weight else frozenset()
