"""The English rewriter: a user's first-person sentence as a third-person statement about "User".

"I live in Berlin" → "User lives in Berlin.", "my sister Anna …" → "User's sister Anna …", a dropped
"I" ("Got the tattoo last year"), a greeting or a request to the assistant cut off; questions give nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from yak_pipeline.llm.rules.words import TRAILING_PUNCT

# A sentence longer than this is cut at a word boundary, so four of them stay within the limit.
_MAX_SENTENCE_CHARS: Final = 220


_ADVERBS: Final = frozenset(
    """
    also really usually always often sometimes never rarely still just actually currently now
    mostly mainly generally typically normally basically definitely absolutely totally kind sort
    recently finally already even seriously truly literally honestly probably certainly
    """.split()
)


_MODALS: Final = frozenset(
    "can can't cannot could couldn't should shouldn't would wouldn't must mustn't might mightn't may "
    "did didn't had hadn't".split()
)


# Irregular past forms stay as they are ("I grew up in Ohio" → "User grew up in Ohio").
_PAST_FORMS: Final = frozenset(
    """
    was were went grew got had met made took came saw ran began became bought left lost found
    thought knew wrote spent sold taught did said felt kept fell broke chose drove ate gave won
    built heard held brought caught fought sang swam sat stood understood told paid put set let
    cut hurt quit read slept woke wore rode flew drew threw forgot
    """.split()
)


_HEDGE_PREFIX: Final = re.compile(
    r"^(?:i\s+(?:think|guess|believe|suppose|reckon|feel\s+like|assume|imagine)(?:\s+that)?"
    r"|maybe|probably|perhaps|possibly|apparently)\b[,]?\s*",
    re.I,
)


_HEDGE_WORD: Final = re.compile(
    r"\b(?:maybe|probably|perhaps|possibly|might|not\s+sure|i\s+guess|i\s+think|i\s+suppose|"
    r"i\s+believe|kind\s+of|sort\s+of|i\s+reckon)\b",
    re.I,
)


_FILLER: Final = re.compile(
    r"^(?:(?:well|so|oh|ok|okay|hi|hey|hello|yes|yeah|yep|no|nope|actually|also|and|but|btw|"
    r"by\s+the\s+way|honestly|anyway|fun\s+fact|just\s+so\s+you\s+know|for\s+context|fyi|fwiw|"
    r"thanks|thank\s+you|great|cool|sure|right)\b[\s,:;!.\-—]*)+",
    re.I,
)


# Intro phrases that may precede the subject: "Last year I moved …", "In my free time I paint …".
_INTRO_STARTERS: Final = frozenset(
    """
    in on at since last next this every when after before during for as from yesterday today
    tomorrow recently now currently lately nowadays back once these those while because
    """.split()
)


_VOCATIVE: Final = re.compile(r"^[A-Z][a-z]+(?:\s[A-Z][a-z]+)?[,!]\s*")


_ELIDED_LEADS: Final = frozenset("just finally recently already also actually".split())


# Past forms that are as often present tense or imperative ("Read this", "Let me know"), or
# describe a state rather than an act ("Was fun"), and "-ed" words that describe a feeling.
_NOT_ELIDED_VERBS: Final = frozenset(
    """
    read set put cut let hurt quit was were did
    excited thrilled stoked pleased blessed interested tired exhausted scared worried amazed
    inspired motivated obsessed hooked surprised relieved impressed touched delighted
    overwhelmed talented gifted bored annoyed confused stressed shocked glad
    """.split()
)


# Present-tense verbs of feeling and intent that chat uses without "I" ("Love it here", "Hope to go").
_ELIDED_PRESENT: Final = frozenset("love like hope wish miss need want plan adore enjoy".split())


_ELIDED_GERUNDS: Final = frozenset(
    "planning thinking going trying looking working hoping heading getting starting learning taking".split()
)


_BULLET: Final = re.compile(r"^\s*(?:[-*•]+|\d+[.)])\s+")


# "Remind me that my club meets Thursdays" asks to remember a fact: the fact is what follows.
_REMEMBER_REQUEST: Final = re.compile(
    r"^(?:please\s+|pls\s+|can\s+you\s+|could\s+you\s+)?(?:remind\s+me|remember|note|keep\s+in\s+mind|"
    r"don'?t\s+forget|do\s+not\s+forget|make\s+a\s+note)\s+(?:that\s+)?(?=\S)", re.I)


# A request to the assistant tacked onto a statement ("I love Thai food, so please never suggest
# satay") is an instruction for this conversation, not a fact about the user: it is cut off.
_TRAILING_REQUEST: Final = re.compile(
    r"[,;:]?\s+(?:so|and|but)?\s*(?:please|pls|kindly|can\s+you|could\s+you|would\s+you)\b.*$", re.I)


_ROLE_LINE: Final = re.compile(r"^[ \t]*(user|assistant|system)[ \t]*:[ \t]?", re.I | re.M)


def user_part(exchange: str) -> str:
    """The user's words in an exchange "User: …\\nAssistant: …" (every user turn), else the whole text.

    An exchange whose user turns are empty gives ``""``: the assistant's words are not the user's.
    """
    roles = list(_ROLE_LINE.finditer(exchange))
    parts: list[str] = []
    for index, match in enumerate(roles):
        if match.group(1).lower() != "user":
            continue
        end = roles[index + 1].start() if index + 1 < len(roles) else len(exchange)
        parts.append(exchange[match.end() : end].strip())
    if not roles or all(m.group(1).lower() != "user" for m in roles):
        return exchange.strip()
    # In exchange form with an empty user turn: the user said nothing (the assistant's words are not theirs).
    return "\n".join(part for part in parts if part)


def third_person_verb(verb: str) -> str:
    """``verb`` conjugated for "User" (live → lives, go → goes, study → studies); past forms unchanged."""
    low = verb.lower()
    irregular = {"have": "has", "do": "does", "go": "goes", "be": "is", "am": "is"}
    if low in irregular:
        return irregular[low]
    if low in _PAST_FORMS or low.endswith("ed") or low in _MODALS:
        return verb
    if low.endswith(("s", "sh", "ch", "x", "z", "o")):
        return verb + "es"
    if len(low) > 1 and low.endswith("y") and low[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


# Mid-sentence first-person words, rewritten after the subject ("… with my wife" → "… with their wife").
_PRONOUNS: Final = [
    (re.compile(r"\bi\s*'\s*m\b|\bi\s+am\b", re.I), "they are"),
    (re.compile(r"\bi\s+was\b", re.I), "they were"),
    (re.compile(r"\bi\s*'\s*ve\b", re.I), "they have"),
    (re.compile(r"\bi\s*'\s*ll\b", re.I), "they will"),
    (re.compile(r"\bi\s*'\s*d\b", re.I), "they would"),
    (re.compile(r"\bi\b(?!\.)", re.I), "they"),
    (re.compile(r"\bmyself\b", re.I), "themselves"),
    (re.compile(r"\bmine\b", re.I), "theirs"),
    (re.compile(r"\bmy\b", re.I), "their"),
    (re.compile(r"\bme\b", re.I), "them"),
    # Plural first person, lower case only: mid-sentence "we"/"us"/"our" (not "US", the country).
    (re.compile(r"\bwe\s*'\s*re\b"), "they are"),
    (re.compile(r"\bwe\s*'\s*ve\b"), "they have"),
    (re.compile(r"\bwe\b"), "they"),
    (re.compile(r"\bus\b"), "them"),
    (re.compile(r"\bours\b"), "theirs"),
    (re.compile(r"\bour\b"), "their"),
]


def _rewrite_pronouns(text: str) -> str:
    """First-person words inside a clause, in the third person."""
    for pattern, replacement in _PRONOUNS:
        text = pattern.sub(replacement, text)
    return text


def rewrite_subject(clause: str) -> str | None:
    """A clause starting with a first-person subject, rewritten to start with "User"; else ``None``."""
    rules: list[tuple[str, str]] = [
        (r"^my\s+(.+?)\s+and\s+i\s+", r"User and their \1 "),
        (r"^([A-Z][\w-]*)\s+and\s+i\s+", r"User and \1 "),
        (r"^(?:please\s+)?call\s+me\s+", "User goes by "),
        (r"^i\s*'\s*m\b|^i\s+am\b|^im\s+(?=an?\b)", "User is"),
        (r"^i\s*'\s*ve\s+been\b|^i\s+have\s+been\b", "User has been"),
        (r"^i\s*'\s*ve\b|^i\s+have\b", "User has"),
        (r"^i\s*'\s*d\s+been\b", "User had been"),
        (r"^i\s*'\s*d\b|^i\s+would\b", "User would"),
        (r"^i\s*'\s*ll\b|^i\s+will\b", "User will"),
        (r"^i\s+was\b", "User was"),
        (r"^i\s+(?:don'?t|do\s+not)\b", "User does not"),
        (r"^my\s+", "User's "),
        # "We" is the user with others (family, friends, a team): still a statement about the user.
        (r"^we\s*'\s*re\b|^we\s+are\b", "User and others are"),
        (r"^we\s*'\s*ve\b|^we\s+have\b", "User and others have"),
        (r"^we\s*'\s*ll\b|^we\s+will\b", "User and others will"),
        (r"^we\s*'\s*d\b|^we\s+would\b", "User and others would"),
        (r"^we\s+(?=[a-z])", "User and others "),
        (r"^our\s+", "User's "),
    ]
    for pattern, replacement in rules:
        match = re.match(pattern, clause, re.I)
        if match:
            head = match.expand(replacement)
            return head + _rewrite_pronouns(clause[match.end() :])
    match = re.match(r"^i\s+", clause, re.I)
    if not match:
        return None
    words = clause[match.end() :].split(" ")
    # Adverbs between subject and verb stay: "I usually run" → "User usually runs".
    index = 0
    while index < len(words) - 1 and (
        words[index].lower() in _ADVERBS
        or (index > 0 and words[index].lower() == "of" and words[index - 1].lower() in {"kind", "sort"})
        # "I no longer eat meat": "no longer" is one adverb ("User noes longer eat" was the garble).
        or (words[index].lower() == "no" and words[index + 1].lower() == "longer")
        or (index > 0 and words[index].lower() == "longer" and words[index - 1].lower() == "no")
    ):
        index += 1
    if not words or not words[index] or not words[index][0].isalpha():
        return None
    words[index] = third_person_verb(words[index])
    rest = " ".join(words)
    return "User " + _rewrite_pronouns(rest)


@dataclass(frozen=True)
class Statement:
    """One rewritten sentence, whether it was hedged, and the user's original words (for the tier)."""

    text: str
    hedged: bool
    original: str


def clip(text: str, limit: int) -> str:
    """``text`` cut at a word boundary to at most ``limit`` characters, marked with '...' when cut."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 3]
    if " " in cut[limit // 2 :]:
        cut = cut.rsplit(" ", 1)[0]
    return TRAILING_PUNCT.sub("", cut) + "..."


def finish(text: str) -> str:
    """A sentence with a capital first letter, ending in exactly one full stop."""
    text = TRAILING_PUNCT.sub("", " ".join(text.split()))
    text = clip(text, _MAX_SENTENCE_CHARS)
    if text.endswith("..."):
        return text[0].upper() + text[1:]
    return text[0].upper() + text[1:] + "."


def third_person_statement(sentence: str) -> Statement | None:
    """Rewrite one of the user's sentences as a third-person statement, or ``None`` if it is none."""
    original = " ".join(_BULLET.sub("", sentence).split())
    if not original or original.rstrip(" \"')").endswith("?"):
        return None  # a question tells what the user wants, not what is true of them
    text = _FILLER.sub("", original)
    if text != original:
        # After a greeting or interjection, a name and a comma is whom the user addresses: "Hi Maria, …".
        text = _VOCATIVE.sub("", text)
    text = _REMEMBER_REQUEST.sub("", text)
    text = TRAILING_PUNCT.sub("", _TRAILING_REQUEST.sub("", text))
    if not text:
        return None
    hedged = bool(_HEDGE_WORD.search(text))
    hedge = _HEDGE_PREFIX.match(text)
    if hedge:
        hedged = True
        remainder = text[hedge.end() :]
        rewritten = rewrite_subject(remainder) if remainder else None
        if rewritten is None:
            # "I think Python is great" is still an opinion of the user's; "maybe it rains" is nothing.
            rewritten = rewrite_subject(text) if text.lower().startswith("i ") else None
    else:
        rewritten = rewrite_subject(text)
    if rewritten is None:
        rewritten = _rewrite_after_intro(text)
    if rewritten is None:
        rewritten = _rewrite_elided_subject(text)
    if rewritten is None:
        return None
    return Statement(text=finish(rewritten), hedged=hedged, original=original)


def _rewrite_elided_subject(text: str) -> str | None:
    """"Got the tattoo a few years ago" → "User got the tattoo a few years ago": chat often drops the "I".

    Only a sentence that opens with an unambiguous past-tense verb (optionally after "just",
    "finally" …) is read this way; "Read this!" or "Excited to go" are not acts the user reports.
    """
    words = text.split(" ")
    index = 0
    while index < len(words) - 1 and words[index].lower() in _ELIDED_LEADS:
        index += 1
    verb = words[index].lower()
    if len(words) - index < 3 or verb in _NOT_ELIDED_VERBS:
        return None
    lead = [w.lower() for w in words[:index]]
    rest = words[index + 1 :]
    if verb == "been":
        said = [*lead, "has been", *rest]  # "Been to Rome once"
    elif verb in _ELIDED_PRESENT:
        said = [*lead, third_person_verb(verb), *rest]  # "Love experimenting with spices"
    elif verb.endswith("ing") and verb in _ELIDED_GERUNDS:
        said = ["is", *lead, verb, *rest]  # "Planning a trip there next month"
    elif verb in _PAST_FORMS or (len(verb) > 4 and verb.endswith("ed") and not verb.endswith("eed")):
        said = [*lead, verb, *rest]
    else:
        return None
    return "User " + _rewrite_pronouns(" ".join(said))


def _rewrite_after_intro(text: str) -> str | None:
    """"When I was a kid, I lived in Ohio" → "User lived in Ohio when they were a kid"."""
    # The statement may follow any comma of a short lead-in: "Since we last chatted, I've …".
    for comma in re.finditer(",", text):
        head, tail = text[: comma.start()].strip(), text[comma.end() :].strip()
        if len(head.split()) > 8:
            break
        rewritten = rewrite_subject(tail) if tail else None
        if rewritten is not None:
            return rewritten + " " + _lower_first(_rewrite_pronouns(head))
    match = re.search(r"\bi\b(?=\s|')", text, re.I)
    if match is None or match.start() == 0:
        return None
    intro = text[: match.start()].strip()
    words = intro.split()
    if not words or len(words) > 6 or words[0].lower() not in _INTRO_STARTERS:
        return None
    rewritten = rewrite_subject(text[match.start() :])
    if rewritten is None:
        return None
    return rewritten + " " + _lower_first(_rewrite_pronouns(intro))


def _lower_first(text: str) -> str:
    """``text`` with a lower-case first letter, unless it starts an acronym or a proper name of two capitals."""
    if len(text) > 1 and text[1].isupper():
        return text
    return text[:1].lower() + text[1:]
