"""Words and sentences, as every part of the rules provider reads them: content words, crude stems, negations."""

from __future__ import annotations

import re
from collections.abc import Set
from typing import Final

from yak_pipeline.core.sentences import split_sentences

STOP_WORDS: Final = frozenset(
    """
    a an the and or but if then than so of in on at to for from by with about as into onto over
    under up down out off again also just only very too not no nor own same such is am are was
    were be been being have has had having do does did doing will would shall should can could may
    might must i me my mine myself we us our ours you your yours he him his she her hers it its
    they them their theirs this that these those there here what which who whom whose when where
    why how all any both each few more most other some user users s t don doesn didn isn aren
    wasn weren won can't get got go going really quite
    """.split()
)


_NEGATION: Final = re.compile(r"\b(?:not|never|no\s+longer|no)\b", re.I)


_WORD: Final = re.compile(r"[^\W_]+(?:'[^\W_]+)?")


TRAILING_PUNCT: Final = re.compile(r"[\s.!?…,;:]+$")


def words_of(text: str) -> list[str]:
    """Lower-case words of ``text``, apostrophes kept inside words."""
    return [w.lower().replace("’", "'") for w in _WORD.findall(text.replace("’", "'"))]


# People typing fast write "i live in berlin. i love dogs": a lower-case "i"/"my" after a full stop
# still starts a new first-person sentence, though the shared splitter wants a capital.
_LOWERCASE_START: Final = re.compile(r"(?<=[.!?])\s+(?=(?:i|i'm|i've|i'd|i'll|im|my)\b)")


def sentences_of(text: str) -> list[str]:
    """Sentences of ``text``, also breaking at line ends (users write lists and one fact per line)."""
    sentences: list[str] = []
    for line in text.splitlines():
        for sentence in split_sentences(line):
            sentences.extend(piece for piece in _LOWERCASE_START.split(sentence) if piece.strip())
    return sentences


def normalised(sentence: str) -> str:
    """A sentence reduced to its lower-case words, for "is this the same sentence?" comparisons."""
    return " ".join(words_of(sentence))


def negation_free(sentence: str) -> tuple[str, bool]:
    """The sentence in lower case with negations removed, and whether there were any."""
    text = " ".join(sentence.lower().replace("’", "'").split())
    text = re.sub(r"\bcan't\b|\bcannot\b", "can not", text)
    text = re.sub(r"\bwon't\b", "will not", text)
    text = re.sub(r"n't\b", " not", text)
    negated = bool(_NEGATION.search(text))
    text = re.sub(r"\b(?:does|do|did)\s+not\s+", "", text)
    text = re.sub(r"\b(?:not|never|no\s+longer)\s+", "", text)
    return TRAILING_PUNCT.sub("", text), negated


def stem(word: str) -> str:
    """A crude stem, enough to match "lives", "living" and "live", or "hikes" and "hiking"."""
    word = word.removesuffix("'s")
    if len(word) > 4 and word.endswith("ies"):
        word = word[:-3] + "y"
    elif len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    if len(word) > 5 and word.endswith("ing"):
        word = word[:-3]
    elif len(word) > 4 and word.endswith("ed"):
        word = word[:-2]
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]
    return word


def content_words(text: str) -> set[str]:
    """Stemmed content words of ``text`` (stop words, negations and "User" removed)."""
    return {stem(w) for w in words_of(text) if w not in STOP_WORDS and w.removesuffix("'s") not in STOP_WORDS}


def jaccard(a: Set[str], b: Set[str]) -> float:
    """Jaccard similarity of two sets (0 when both are empty)."""
    union = a | b
    return len(a & b) / len(union) if union else 0.0
