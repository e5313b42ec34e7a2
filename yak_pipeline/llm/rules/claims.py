"""Sentences read as claims (subject / predicate / value, negated or not): what consolidation uses to let a
newer statement supersede an older one, and the word-overlap contradiction check.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from yak_pipeline.llm.rules.english import rewrite_subject
from yak_pipeline.llm.rules.words import content_words, jaccard, negation_free, sentences_of

VALUE_END: Final = re.compile(r",|;|\s(?:and|but|with|since|because|for|where|who|which|when|while|as|until)\s")


PREDICATES: Final[list[tuple[str, re.Pattern[str]]]] = [
    ("name", re.compile(r"^(?P<subj>.+?)\s+(?:name\s+is|goes\s+by|is\s+called|is\s+named)\s+(?P<val>.+)$")),
    ("age", re.compile(r"^(?P<subj>.+?)\s+is\s+(?P<val>\d{1,3})(?:\s+years?\s+old)?\b")),
    (
        "marital",
        re.compile(r"^(?P<subj>.+?)\s+is\s+(?P<val>married|single|divorced|engaged|widowed)\b"),
    ),
    (
        "location",
        re.compile(
            r"^(?P<subj>.+?)\s+(?:(?:currently|now|still)\s+)?"
            r"(?:lives?|is\s+living|resides?|is\s+based|is\s+located)\s+in\s+(?P<val>.+)$"
        ),
    ),
    ("origin", re.compile(r"^(?P<subj>.+?)\s+(?:is|are|comes?)\s+(?:originally\s+)?from\s+(?P<val>.+)$")),
    ("born", re.compile(r"^(?P<subj>.+?)\s+was\s+born\s+in\s+(?P<val>.+)$")),
    ("occupation", re.compile(r"^(?P<subj>.+?)\s+works?\s+as\s+(?:an?\s+)?(?P<val>.+)$")),
    ("employer", re.compile(r"^(?P<subj>.+?)\s+works?\s+(?:at|for)\s+(?P<val>.+)$")),
    ("is_a", re.compile(r"^(?P<subj>.+?)\s+is\s+an?\s+(?P<val>.+)$")),
]


@dataclass(frozen=True)
class Claim:
    """A sentence read as subject / predicate / value, with whether it is negated."""

    subject: str
    predicate: str
    value: str
    negated: bool


def claims_of(text: str) -> list[Claim]:
    """Every subject/predicate/value claim found in the sentences of ``text``."""
    claims: list[Claim] = []
    for sentence in sentences_of(text):
        plain, negated = negation_free(rewrite_subject(sentence) or sentence)
        for predicate, pattern in PREDICATES:
            match = pattern.match(plain)
            if match is None:
                continue
            value = VALUE_END.split(match.group("val"), maxsplit=1)[0]
            value = re.sub(r"^(?:the|a|an)\s+", "", value.strip(" .!?\"'"))
            subject = " ".join(match.group("subj").split())
            if value:
                claims.append(Claim(subject, predicate, value, negated))
            break  # one claim per sentence: the most specific predicate wins
    return claims


def same_value_in(claim: Claim, others: list[Claim]) -> bool:
    """Whether ``others`` hold a claim with the same subject, predicate and value as ``claim``."""
    return any(
        o.subject == claim.subject and o.predicate == claim.predicate and same_value(o.value, claim.value)
        for o in others
    )


def same_value(a: str, b: str) -> bool:
    """Whether two values name the same thing ("berlin" and "berlin germany" do)."""
    return a == b or a.startswith(b + " ") or b.startswith(a + " ")


def differing_values_score(a: Claim, b: Claim) -> float:
    """Score of two un-negated claims giving different values to the same subject and predicate.

    "is a …" is weaker evidence than "lives in …": a person can be a nurse and a mother, so only
    short, noun-like values ("nurse" / "teacher") count, and they score just above the 0.7 line.
    """
    if a.predicate == "vehicle":
        return 0.8  # a household may keep two cars: just above the line, so a person reviews it
    if a.predicate != "is_a":
        return 0.85
    if len(a.value.split()) <= 2 and len(b.value.split()) <= 2:
        return 0.8
    return 0.0


@dataclass(frozen=True)
class SentenceReading:
    """What :func:`readings_conflict` reads of one sentence: its words without negations, whether
    it had any, and its content words. Read once per text when a text is compared with many."""

    plain: str
    negated: bool
    words: frozenset[str]


def read_sentence(sentence: str) -> SentenceReading:
    """One sentence read for :func:`readings_conflict`."""
    plain, negated = negation_free(sentence)
    return SentenceReading(plain, negated, frozenset(content_words(plain)))


def readings_conflict(a: SentenceReading, b: SentenceReading) -> float:
    """Contradiction score of two single sentences, each read by :func:`read_sentence`: 0.8 when
    one negates what the other says in mostly the same words, else 0.3 × their word overlap."""
    overlap = jaccard(a.words, b.words)
    if a.negated != b.negated and overlap >= 0.6:
        return 0.8
    return round(0.3 * overlap, 4) if a.plain != b.plain else 0.0
