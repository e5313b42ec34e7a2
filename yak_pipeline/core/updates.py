"""Statements that announce a new value: "the commits merged into main have now reached 165", "the
new sprint deadline of April 5", "my coverage recently improved to 78%".

People say a value once and its change later, usually with the old value out of sight: a question
about the value ("How many commits are merged?") then finds both statements close in meaning, and
the older may rank first. A statement that says it is a change is the current value, so recall
puts it ahead of the older memories near it (``core.recall.updates_first``). Read from the words
alone, deterministic; a change said without such words ("I've added 52 sources") is not seen.

Measured on the collected candidates of the three dev files (cross-validated models): BEAM's
knowledge updates with the current statement first 0.500 → 0.700 on the ten questions not read
when these cues were written (0.875 on the eight that were), MRR and Recall@10 of paraphrase and
LoCoMo unchanged. Session 20 added the words of a moved date or time ("rescheduled", "postponed",
"instead of", "the new April 25 deadline") after reading all 18 of BEAM's knowledge-update questions,
so its gain (13 → 16 of 18 current first) is in sample; docs/RECALL.md.
"""

from __future__ import annotations

import re
from typing import Final

# A new value announced: "has now", "now reached", "new deadline" (also "the new April 25 deadline",
# "the new sprint deadline": up to two words between), "recently improved", "increased to", "updated
# to", and a date or time changed: "rescheduled", "postponed", "pushed back", "instead of". Verbs of
# change that could move anything need their "to" (a new value follows), "new" its noun.
UPDATE_CUE: Final = re.compile(
    r"\b(has now|have now|now (?:at|reached|has|have|is|are|stands|due|scheduled|set for)|"
    r"new (?:[\w-]+ ){0,2}(?:deadline|quota|total|version|date|time|limit|target|goal|schedule)|"
    r"recently (?:improved|increased|changed|updated|moved|grown|reached|risen|dropped)|"
    r"(?:increased|improved|grown|risen|dropped|decreased|changed|updated|moved|extended|pushed back|raised) to|"
    r"rescheduled|postponed|pushed back|brought forward|moved (?:up|forward|back)|instead of|"
    r"now (?:have|has) a total|updated (?:to|my))\b", re.IGNORECASE)


def announces_update(text: str) -> bool:
    """True when ``text`` says that something changed to a new value (module docstring)."""
    return bool(UPDATE_CUE.search(text))


# A statement of how things stand now, after a change: "User drives a Subaru Forester now", "User
# has stopped drinking completely", "User no longer eats meat", "User switched to oat milk".
CHANGE_CUE: Final = re.compile(
    r"\b(now|nowadays|these days|currently|no longer|any ?more|stopped|quit|gave up|switched|started)\b",
    re.IGNORECASE)


def tells_of_change(text: str) -> bool:
    """True when ``text`` says how things stand now or that they changed (:data:`CHANGE_CUE`).

    Broader than :func:`announces_update` (a new *value*): read only for a question about the
    present and only in a distilled memory (``store.recall``, the relevance feature
    ``present_change``). A distillation states facts, where these words mark a change; a chat turn
    says "now" of the moment ("I'm at work now"), and reading the user's own words too cost
    paraphrase one question of Recall@10 without a distiller (docs/RECALL.md).
    """
    return bool(CHANGE_CUE.search(text))
