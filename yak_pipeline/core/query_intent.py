"""What a recall query asks about, read from its words alone (deterministic, before any model).

A question that *gathers* ("How many times did I …", "List all …", "In what order did I …",
"Summarise …", "… across my sessions") wants every memory on its topic, not the one best:
:func:`asks_to_gather` reads it, and the block then holds more memories, in the order they were
said, newest first (``services.recall.build_context``).

A question that names several things to weigh together ("Considering my form validation code,
lazy loading setup and GA4 tracking, …", "How many days between finishing my draft and the
deadline?") needs a memory about each; :func:`query_parts` names them, so recall can look for
each as well as for the whole (``services.recall.search_memories``); so does a question that
gathers over several topics ("… in my questions about tossing coins and rolling dice").

A question about the *present* ("Which town do I live in now?", "What's my usual drink these
days?", "Do I still play bass?") is answered by the latest of the memories on its topic: people
change jobs, homes, diets and partners, and each change is said once, after the old value was.
Recall orders the memories it chose for such a question newest first (``core.recall``), and the
evaluation uses the same reading to find the statement a knowledge update replaced
(``eval.locomo``). A question asking *when* or *how long* is not one, even with a present word in
it ("How long has she had her current friends?").

A question about the *past* ("What did I use to drink?", "Where did I live before Porto?",
"my old job") wants what was true then, the values a newer memory replaced among them: the
memory block leaves superseded memories out for every other question.
"""

from __future__ import annotations

import re
from datetime import date
from typing import Final

from yak_pipeline.core.dates import calendar_dates

# Words that put a question in the present. "Latest" and "recent" ask for the newest value too ("my
# latest score", "during the recent period"): with them BEAM's knowledge updates come current first
# 17 times in 18, not 16 (docs/RECALL.md).
PRESENT_CUE: Final = re.compile(
    r"\b(now|nowadays|current|currently|these days|at the moment|at present|presently|lately|"
    r"at this point|still|any ?more|latest|recent)\b", re.IGNORECASE)
# ...but not one asking for a time or a duration.
TIME_QUESTION: Final = re.compile(
    r"^\W*(when\b|how long\b|how many (minutes|hours|days|weeks|months|years)\b|"
    r"(what|which) (year|month|week|day|date|time)\b)", re.IGNORECASE)


def asks_about_present(question: str) -> bool:
    """True for a question about the current value of something ("Which town do I live in now?").

    A question asking for a time or duration ("How long has she had her current friends?") is not
    one, even with a present word in it.
    """
    return bool(PRESENT_CUE.search(question)) and not TIME_QUESTION.search(question)


# Words that ask for what was true before, or for how something changed.
PAST_CUE: Final = re.compile(
    r"\b(used to|did (i|you|we|they|he|she) use to|before|previous(ly)?|formerly|former|in the past|originally|at first|at the time|"
    r"back then|earlier|old|older|no longer|history|changed?|switch(ed)?|anymore)\b", re.IGNORECASE)


def asks_about_past(question: str) -> bool:
    """True for a question about what was true before ("What did I use to drink?", "Where did I
    live before?"), or about a change, whose answer needs the old value too."""
    return bool(PAST_CUE.search(question))


# A question that lists things to weigh together: "Considering A, B and C, …", "between A and B".
_LISTING: Final = re.compile(r"\b(?:considering|between)\s+(.+)", re.IGNORECASE)
# Where the list ends: the question goes on ("…, how should I …") or ends.
_LIST_END: Final = re.compile(r",\s*(?:and\s+)?(?:how|what|which|where|when|why|who|can|could|should|would|do|does|did|is|are|"
                              r"will)\b|\?", re.IGNORECASE)
# Between the items: a comma (not inside a number such as 3,600), "and", "or".
_ITEM_SEPARATOR: Final = re.compile(r"(?<!\d),(?!\d)\s*(?:and\s+|or\s+)?|\s+(?:and|or)\s+", re.IGNORECASE)
# What a gathering question's topics follow: "… my messages about my resume, portfolio, and salary
# negotiation?", "In my questions about tossing coins and rolling dice, how many …".
_TOPIC: Final = re.compile(r"\b(?:about|regarding|on|for|with|involving|of)\s+", re.IGNORECASE)
# Where such a list of topics ends: the words that say where or when they were said.
_TOPIC_TAIL: Final = re.compile(r"\s+(?:across|in|over|during|throughout|since|from|before|after|until|when|that|which)\b.*$",
                                re.IGNORECASE)
MAX_QUERY_PARTS: Final = 4
# Any day will do: only whether an item is a date matters, not which day it is.
_ANY_DAY: Final = date(2000, 1, 1)


def _items(listed: str) -> list[str]:
    items = [item.strip(" ,.;:") for item in _ITEM_SEPARATOR.split(listed)]
    return [item for item in items if any(c.isalpha() for c in item)]


def _is_date(item: str) -> bool:
    """True when ``item`` is only a date ("August 15 2023", "11 December"): the end of a time window."""
    rest = item
    for phrase, _ in calendar_dates(item, _ANY_DAY):
        rest = rest.replace(phrase, "")
    return rest != item and not any(c.isalpha() for c in rest)


def query_parts(question: str) -> list[str]:
    """The things a question lists to weigh together (at least two, at most :data:`MAX_QUERY_PARTS`),
    or [] for a question about one thing.

    "Considering my form validation code, lazy loading setup, and GA4 tracking, how …" gives the
    three; "How many days between finishing my draft and the scholarship deadline?" the two ends.
    A question that gathers (:func:`asks_to_gather`) also lists the topics it gathers over: "How
    many calculations did I confirm in my questions about tossing coins and rolling dice?" gives
    "tossing coins" and "rolling dice" (the last such list in the question). A time window ("Where
    was John between August 11 and August 15?") is one thing, not two.
    Each is looked for on its own as well as within the whole question, so the block gets a
    memory of each even when one dominates the whole question's similarity."""
    match = _LISTING.search(question)
    if match is not None:
        items = _items(_LIST_END.split(match.group(1), maxsplit=1)[0])
        if len(items) >= 2 and not all(_is_date(item) for item in items):
            return items[:MAX_QUERY_PARTS]
    if not asks_to_gather(question):
        return []
    # The last word that introduces a list: "… based on my messages about A, B, and C".
    for topic in reversed(list(_TOPIC.finditer(question))):
        listed = _TOPIC_TAIL.sub("", _LIST_END.split(question[topic.end():], maxsplit=1)[0])
        items = _items(listed)
        if len(items) >= 2:
            return items[:MAX_QUERY_PARTS]
    return []


# Words of a question that gathers across what was said, rather than looking up one fact.
GATHER_CUE: Final = re.compile(
    r"\b(how many|how much (?:\w+ )*(?:in total|altogether|overall)|list (?:all|every|each)|all (?:the|of the|my)|"
    r"every (?:time|one)|each time|in (?:what|which) order|what order|the order|order (?:of|in which)|"
    r"summari[sz]e|summary|across (?:my|our|all|the|these|those)|in total|altogether|so far|over time|evolve[ds]?|"
    r"progress(?:ed)?|timeline)\b", re.IGNORECASE)


def asks_to_gather(question: str) -> bool:
    """True for a question that gathers across what was said ("How many times did I mention …?",
    "In what order did I bring up …?", "Summarise …", "… across my sessions"): its answer is spread
    over several memories, so the block holds more of them, dated, newest first."""
    return bool(GATHER_CUE.search(question))
