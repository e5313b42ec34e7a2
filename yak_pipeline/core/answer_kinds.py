"""What kind of thing a question asks for, and whether a memory's words hold one (deterministic).

"When did I move to Porto?" wants a date, "How many interviews have I secured?" a number, "What's
my sister's son called?" a name. A memory on the question's topic that holds a thing of that kind
("…moved to Porto in March 2024", "…secured 3 interviews", "…named him Ebuka") is likelier to be
the answer than one that only shares the topic ("Porto is lovely"): :func:`wanted_kind` reads the
kind from the question's words and :func:`holds_kind` looks for one in a memory's, and the
relevance model weighs the match (``core.relevance``'s ``answer_kind`` feature, fitted and
cross-validated on the dev files: docs/RECALL.md). A question that asks for none of these kinds
("Where do I process my photos?", "What do I do for a living?") matches nothing.

English only, like the rules distiller; a bound, not a parser: a capitalised word inside a
sentence counts as a name, any numeral or number word as a number.
"""

from __future__ import annotations

import re
from typing import Final, Literal

from yak_pipeline.core.dates import MONTH, WEEKDAYS

AnswerKind = Literal["date", "number", "name"]

# The question's words that ask for each kind, in the order they are tried: "How long ago …" is a
# date, "How long …" a number of something.
_WANTS: Final[tuple[tuple[AnswerKind, re.Pattern[str]], ...]] = (
    ("date", re.compile(r"\b(when|what date|what day|which day|what year|which year|how long ago|what time)\b",
                        re.IGNORECASE)),
    ("number", re.compile(r"\b(how many|how much|what age|how old|what percentage|what percent|what score|"
                          r"how far|how long)\b", re.IGNORECASE)),
    ("name", re.compile(r"\b(who|whom|whose|what'?s? (?:[\w']+ ){0,3}name|called|named)\b", re.IGNORECASE)),
)
_DAYS: Final = "(?:" + "|".join((*WEEKDAYS, "weekend", "yesterday", "tomorrow", "tonight", "today")) + ")"
_HOLDS: Final[dict[AnswerKind, re.Pattern[str]]] = {
    "date": re.compile(rf"\b(?:{MONTH}|{_DAYS}|(?:19|20)\d\d|\d{{1,2}}(?:st|nd|rd|th)|last (?:week|month|year|night)|"
                       r"next (?:week|month|year)|\d+ (?:days?|weeks?|months?|years?) ago|ago)\b", re.IGNORECASE),
    "number": re.compile(r"\b(?:\d+(?:[.,]\d+)?%?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|"
                         r"twenty|thirty|forty|fifty|hundred|dozen|half)\b", re.IGNORECASE),
    # A capitalised word that does not open the text or a sentence, and is not how a memory names
    # its speakers ("User", "I").
    "name": re.compile(r"(?<![.!?]\s)(?<!^)\b(?!User\b|I\b|I'm\b|I've\b|Assistant\b)[A-Z][a-z]+"),
}


def wanted_kind(question: str) -> AnswerKind | None:
    """The kind of thing ``question`` asks for (a date, a number, a name), or None."""
    for kind, asks in _WANTS:
        if asks.search(question):
            return kind
    return None


def holds_kind(kind: AnswerKind | None, text: str) -> bool:
    """Whether ``text`` (a memory's words) holds a thing of ``kind``; False for no kind."""
    return kind is not None and _HOLDS[kind].search(text) is not None
