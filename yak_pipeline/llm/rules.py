"""The offline rules provider: a deterministic stand-in for the LLM when no endpoint is configured.

It makes Yak usable (and testable) without a model, and it says so: its ``name`` is ``"rules"``
and :func:`yak_pipeline.llm.get_llm_provider` logs that it stands in. It is not a language model
and its judgements are rough; they are designed to be predictable and to err towards review.

How it works:

- **distill** — takes the user's part of "User: …\\nAssistant: …" (the whole text when it is not in
  that form), splits it into sentences and rewrites first-person statements in the third person:
  "I live in Berlin" → "User lives in Berlin.", "I'm a nurse" → "User is a nurse.", "my sister
  Anna …" → "User's sister Anna …", "We moved …" → "User and others moved …". Chat style is read
  too: a greeting and a name before the statement ("Hi Maria, I'm …"), a dropped "I" before an
  unambiguous past-tense verb or a verb of feeling or intent ("Got the tattoo last year" → "User
  got the tattoo last year", "Planning a trip" → "User is planning a trip"). Questions and
  sentences without such a statement are left out. At most 4 sentences are kept (core facts
  first). Confidence: 0.9 for direct statements, 0.65 when any kept statement is hedged ("I
  think", "maybe", "probably" …). With no statement at all the content quotes the user: their
  informative sentences (not questions, at least 5 content words) as "User said: …" with
  confidence 0.7 — the gate keeps it recallable but flags it for review, since a quote is faithful
  but not distilled — or else the start of their first sentence with confidence 0.5, which the
  gate sends to review. Tier by keywords: identity, location, occupation, family and health →
  core; preferences and habits → medium; the rest → low.
- **consolidate** — the newer text's sentences, then the older text's sentences that are not
  already there and not superseded (same subject and predicate, e.g. "User lives in …"), capped at 4.
- **conflict_score** — reads each clause as claims (subject, slot, value, negated) and scores the
  pairs about the same subject: 0.9 when one denies what the other states, 0.85 when a slot that
  holds one value gets two ("lives in" / "moved to", "is from", "was born in", "works as" / "is a
  <job>", "works at", "'s name is", "is N years old", "is married/single …"; 0.8 for "drives a …"
  and short "is a …" values). Denials come in many forms and are read as the plain claim, negated:
  "is not / no longer / isn't … anymore", "stopped / quit / gave up being …", "used to …", "moved
  away from …", and "quit / sold / gave up X" denies any claim whose value is X ("sold the Zoe" /
  "drives a blue Renault Zoe", "quit the nursing job" / "works as a pediatric nurse"). Diets say
  what is (not) eaten, so "is vegetarian" contradicts "is pescatarian" and "started eating fish".
  Things held ("has a dog"), states ("is allergic to …") and food are many at once: only their
  denial contradicts. Paraphrases ("blue Renault Zoe" / "Renault Zoe") are the same value. Else
  0.8 when two clauses share most content words but differ in negation; otherwise at most 0.3
  (scaled by word overlap). Subjects must match, so "User's sister lives in Rome" does not
  contradict "User lives in Berlin".
- **relevance_score** — the overlap coefficient of content words (stop words removed, crude
  stemming): ``|M ∩ C| / min(|M|, |C|)``, 0 when either side has no content words.

Everything here is pure computation on the inputs: no network, no state, hence thread-safe.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from yak_pipeline.core.sentences import count_sentences, split_sentences
from yak_pipeline.core.types import Tier
from yak_pipeline.llm.models import (
    MAX_CONTENT_CHARS,
    MAX_SENTENCES,
    ConsolidationResult,
    DistillationResult,
    LLMCallStats,
    ScoreResult,
)

DIRECT_CONFIDENCE: Final = 0.9
HEDGED_CONFIDENCE: Final = 0.65
SUMMARY_CONFIDENCE: Final = 0.5
QUOTE_CONFIDENCE: Final = 0.7
# A quote needs this many content words to count as reporting something ("Thanks, that's great!" does not).
_QUOTE_MIN_CONTENT_WORDS: Final = 5

# A sentence longer than this is cut at a word boundary, so four of them stay within the limit.
_MAX_SENTENCE_CHARS: Final = 220
_SUMMARY_QUOTE_CHARS: Final = 200

# --- vocabulary ---------------------------------------------------------------------------

_CORE_WORDS: Final = frozenset(
    """
    name named names called nickname live lives living lived reside resides hometown address born
    grew moved relocated work works working worked job jobs career profession employer employed
    unemployed retired occupation boss colleague coworker office company
    teach teaches taught teaching
    engineer developer programmer nurse doctor teacher professor student lawyer designer manager
    accountant scientist researcher artist writer chef pilot farmer architect consultant
    wife husband partner spouse girlfriend boyfriend fiance fiancee sister sisters brother brothers
    sibling siblings mother mom mum father dad parent parents son sons daughter daughters child
    children kid kids baby grandmother grandfather grandma grandpa aunt uncle cousin niece nephew
    family married divorced engaged widowed single pregnant age birthday
    allergic allergy allergies diabetic diabetes disability diagnosed condition medication
    nationality citizen citizenship religion pronouns
    """.split()
)
_MEDIUM_WORDS: Final = frozenset(
    """
    like likes liked love loves loved prefer prefers preferred hate hates dislike dislikes enjoy
    enjoys favourite favorite favourites favorites fan fond into usually always never often
    sometimes rarely every daily weekly monthly weekend weekends mornings evenings habit habits
    routine hobby hobbies vegetarian vegan diet learning studying practising practicing training
    playing collecting reading watching listening eat eats drink drinks meat
    """.split()
)
# "I'm from Spain" is about origin; "a letter from the bank" is not.
_ORIGIN: Final = re.compile(r"\b(?:i'?m|am|is|are|come|comes|came)\s+(?:originally\s+)?from\b", re.I)
_AGE: Final = re.compile(r"\b(?:i'?m|am|is|turned|turning)\s+\d{1,3}\b|\byears?\s+old\b", re.I)
_IDENTITY: Final = re.compile(r"^User\s+is\s+an?\s+(\w+)", re.I)
# "I'm Sam" → "User is Sam." names the user, also when more follows ("User is Sam, they teach …").
_NAME_ONLY: Final = re.compile(r"^(?:User\s+is|I'?m|I\s+am)\s+[A-Z][\w-]*(?:\.?$|,|\s+and\b)")

_STOP_WORDS: Final = frozenset(
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
_WORD: Final = re.compile(r"[^\W_]+(?:'[^\W_]+)?")
_TRAILING_PUNCT: Final = re.compile(r"[\s.!?…,;:]+$")


# --- helpers shared by the four methods --------------------------------------------------


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


def _third_person_verb(verb: str) -> str:
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


def _rewrite_subject(clause: str) -> str | None:
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
        words[index].lower() in _ADVERBS or (index > 0 and words[index].lower() == "of" and words[index - 1].lower() in {"kind", "sort"})
    ):
        index += 1
    if not words or not words[index] or not words[index][0].isalpha():
        return None
    words[index] = _third_person_verb(words[index])
    rest = " ".join(words)
    return "User " + _rewrite_pronouns(rest)


@dataclass(frozen=True)
class _Statement:
    """One rewritten sentence, whether it was hedged, and the user's original words (for the tier)."""

    text: str
    hedged: bool
    original: str


def _clip(text: str, limit: int) -> str:
    """``text`` cut at a word boundary to at most ``limit`` characters, marked with '...' when cut."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 3]
    if " " in cut[limit // 2 :]:
        cut = cut.rsplit(" ", 1)[0]
    return _TRAILING_PUNCT.sub("", cut) + "..."


def _finish(text: str) -> str:
    """A sentence with a capital first letter, ending in exactly one full stop."""
    text = _TRAILING_PUNCT.sub("", " ".join(text.split()))
    text = _clip(text, _MAX_SENTENCE_CHARS)
    if text.endswith("..."):
        return text[0].upper() + text[1:]
    return text[0].upper() + text[1:] + "."


def _statement(sentence: str) -> _Statement | None:
    """Rewrite one of the user's sentences as a third-person statement, or ``None`` if it is none."""
    original = " ".join(_BULLET.sub("", sentence).split())
    if not original or original.rstrip(" \"')").endswith("?"):
        return None  # a question tells what the user wants, not what is true of them
    text = _FILLER.sub("", original)
    if text != original:
        # After a greeting or interjection, a name and a comma is whom the user addresses: "Hi Maria, …".
        text = _VOCATIVE.sub("", text)
    text = _REMEMBER_REQUEST.sub("", text)
    text = _TRAILING_PUNCT.sub("", _TRAILING_REQUEST.sub("", text))
    if not text:
        return None
    hedged = bool(_HEDGE_WORD.search(text))
    hedge = _HEDGE_PREFIX.match(text)
    if hedge:
        hedged = True
        remainder = text[hedge.end() :]
        rewritten = _rewrite_subject(remainder) if remainder else None
        if rewritten is None:
            # "I think Python is great" is still an opinion of the user's; "maybe it rains" is nothing.
            rewritten = _rewrite_subject(text) if text.lower().startswith("i ") else None
    else:
        rewritten = _rewrite_subject(text)
    if rewritten is None:
        rewritten = _rewrite_after_intro(text)
    if rewritten is None:
        rewritten = _rewrite_elided_subject(text)
    if rewritten is None:
        return None
    return _Statement(text=_finish(rewritten), hedged=hedged, original=original)


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
        said = [*lead, _third_person_verb(verb), *rest]  # "Love experimenting with spices"
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
        rewritten = _rewrite_subject(tail) if tail else None
        if rewritten is not None:
            return rewritten + " " + _lower_first(_rewrite_pronouns(head))
    match = re.search(r"\bi\b(?=\s|')", text, re.I)
    if match is None or match.start() == 0:
        return None
    intro = text[: match.start()].strip()
    words = intro.split()
    if not words or len(words) > 6 or words[0].lower() not in _INTRO_STARTERS:
        return None
    rewritten = _rewrite_subject(text[match.start() :])
    if rewritten is None:
        return None
    return rewritten + " " + _lower_first(_rewrite_pronouns(intro))


def _lower_first(text: str) -> str:
    """``text`` with a lower-case first letter, unless it starts an acronym or a proper name of two capitals."""
    if len(text) > 1 and text[1].isupper():
        return text
    return text[:1].lower() + text[1:]


def _words(text: str) -> list[str]:
    """Lower-case words of ``text``, apostrophes kept inside words."""
    return [w.lower().replace("’", "'") for w in _WORD.findall(text.replace("’", "'"))]


def _tier(texts: Iterable[str]) -> Tier:
    """Keyword tier of a distillation: identity/location/occupation/family/health → core, preferences → medium."""
    texts_list = list(texts)
    joined = " ".join(texts_list)
    words = set(_words(joined))
    if words & _CORE_WORDS or _ORIGIN.search(joined) or _AGE.search(joined) or "goes by" in joined.lower():
        return "core"
    if words & _MEDIUM_WORDS:
        return "medium"
    if any(_NAME_ONLY.match(text.strip()) for text in texts_list):
        return "core"
    identity = _IDENTITY.search(joined)
    if identity and identity.group(1).lower() not in _MEDIUM_WORDS | {"big", "huge", "bit", "little", "lot"}:
        return "core"
    return "low"


_TIER_ORDER: Final[dict[Tier, int]] = {"core": 0, "medium": 1, "low": 2}


# People typing fast write "i live in berlin. i love dogs": a lower-case "i"/"my" after a full stop
# still starts a new first-person sentence, though the shared splitter wants a capital.
_LOWERCASE_START: Final = re.compile(r"(?<=[.!?])\s+(?=(?:i|i'm|i've|i'd|i'll|im|my)\b)")


def _sentences_of(text: str) -> list[str]:
    """Sentences of ``text``, also breaking at line ends (users write lists and one fact per line)."""
    sentences: list[str] = []
    for line in text.splitlines():
        for sentence in split_sentences(line):
            sentences.extend(piece for piece in _LOWERCASE_START.split(sentence) if piece.strip())
    return sentences


def _valid_text(sentences: list[str], fallback_source: str) -> str:
    """Join sentences into a text that is 1–4 sentences and within the length limit, whatever the input.

    Joining can merge two sentences (an abbreviation at the end of one), never split one; the final
    check is still made, with a word-only fallback, so arbitrary input cannot yield invalid output.
    """
    text = " ".join(sentences)
    if 1 <= count_sentences(text) <= MAX_SENTENCES and len(text) <= MAX_CONTENT_CHARS:
        return text
    words = re.sub(r"[.!?…]+", " ", fallback_source).split()
    quote = _clip(" ".join(words), _SUMMARY_QUOTE_CHARS)
    return f"User said: {quote.rstrip('.')}." if quote else "User sent a message without words."


def _informative(sentence: str) -> bool:
    """A sentence that reports something: not a question, with enough content words to be more than chat."""
    words = [w for w in content_words(sentence) if any(c.isalpha() for c in w)]
    return not sentence.rstrip(" \"')").endswith("?") and len(words) >= _QUOTE_MIN_CONTENT_WORDS


def _summary(user_text: str) -> tuple[str, bool]:
    """One sentence saying what the user said or asked, and whether it quotes something informative.

    The quote starts at the user's first informative sentence (greetings, thanks and questions
    before it are skipped) and runs on through the informative sentences after it, up to the quote
    length, as one sentence; with none, it quotes the start of the first sentence.
    """
    sentences = [" ".join(s.split()) for s in _sentences_of(user_text)]
    sentences = [s for s in sentences if s]
    if not sentences:
        return "User sent an empty message.", False
    informative = [s for s in sentences if _informative(s)]
    if informative:
        # Joined with semicolons so the quote stays one sentence of the distillation.
        quote = _clip("; ".join(_TRAILING_PUNCT.sub("", s) for s in informative), _SUMMARY_QUOTE_CHARS)
        return "User said: " + quote + ("" if quote.endswith("...") else "."), True
    first = _clip(sentences[0], _SUMMARY_QUOTE_CHARS)
    if first.endswith("?"):
        return "User asked: " + first, False
    return "User said: " + _TRAILING_PUNCT.sub("", first) + ("" if first.endswith("...") else "."), False


def _normalised(sentence: str) -> str:
    """A sentence reduced to its lower-case words, for "is this the same sentence?" comparisons."""
    return " ".join(_words(sentence))


# --- predicates used by consolidation and conflict scoring --------------------------------

_VALUE_END: Final = re.compile(r",|;|\s(?:and|but|with|since|because|for|where|who|which|when|while|as|until)\s")
_PREDICATES: Final[list[tuple[str, re.Pattern[str]]]] = [
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
class _Claim:
    """A sentence read as subject / predicate / value, with whether it is negated."""

    subject: str
    predicate: str
    value: str
    negated: bool


def _negation_free(sentence: str) -> tuple[str, bool]:
    """The sentence in lower case with negations removed, and whether there were any."""
    text = " ".join(sentence.lower().replace("’", "'").split())
    text = re.sub(r"\bcan't\b|\bcannot\b", "can not", text)
    text = re.sub(r"\bwon't\b", "will not", text)
    text = re.sub(r"n't\b", " not", text)
    negated = bool(_NEGATION.search(text))
    text = re.sub(r"\b(?:does|do|did)\s+not\s+", "", text)
    text = re.sub(r"\b(?:not|never|no\s+longer)\s+", "", text)
    return _TRAILING_PUNCT.sub("", text), negated


def _claims(text: str) -> list[_Claim]:
    """Every subject/predicate/value claim found in the sentences of ``text``."""
    claims: list[_Claim] = []
    for sentence in _sentences_of(text):
        plain, negated = _negation_free(_rewrite_subject(sentence) or sentence)
        for predicate, pattern in _PREDICATES:
            match = pattern.match(plain)
            if match is None:
                continue
            value = _VALUE_END.split(match.group("val"), maxsplit=1)[0]
            value = re.sub(r"^(?:the|a|an)\s+", "", value.strip(" .!?\"'"))
            subject = " ".join(match.group("subj").split())
            if value:
                claims.append(_Claim(subject, predicate, value, negated))
            break  # one claim per sentence: the most specific predicate wins
    return claims


def _same_value_in(claim: _Claim, others: list[_Claim]) -> bool:
    """Whether ``others`` hold a claim with the same subject, predicate and value as ``claim``."""
    return any(
        o.subject == claim.subject and o.predicate == claim.predicate and _same_value(o.value, claim.value)
        for o in others
    )


def _same_value(a: str, b: str) -> bool:
    """Whether two values name the same thing ("berlin" and "berlin germany" do)."""
    return a == b or a.startswith(b + " ") or b.startswith(a + " ")


def _differing_values_score(a: _Claim, b: _Claim) -> float:
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


def _stem(word: str) -> str:
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
    return {_stem(w) for w in _words(text) if w not in _STOP_WORDS and w.removesuffix("'s") not in _STOP_WORDS}


def _jaccard(a: set[str], b: set[str]) -> float:
    """Jaccard similarity of two sets (0 when both are empty)."""
    union = a | b
    return len(a & b) / len(union) if union else 0.0


def _sentence_conflict(a: str, b: str) -> float:
    """Contradiction score of two single sentences."""
    plain_a, negated_a = _negation_free(a)
    plain_b, negated_b = _negation_free(b)
    words_a, words_b = content_words(plain_a), content_words(plain_b)
    overlap = _jaccard(words_a, words_b)
    if negated_a != negated_b and overlap >= 0.6:
        return 0.8
    return round(0.3 * overlap, 4) if plain_a != plain_b else 0.0


# --- conflict scoring: claims read from frames, negations and changes ---------------------
#
# Two memories contradict when they make claims about the same subject that cannot both hold now:
# two values in a slot that holds one ("lives in Lisbon" / "moved to Porto", "drives a Renault Zoe"
# / "drives a Tesla"), or a claim and its negation ("is vegetarian" / "is no longer vegetarian",
# "works as a nurse" / "quit the nursing job"). Each clause is first reduced to a plain frame
# ("User is vegetarian") and whether it is negated, so that "isn't … anymore", "stopped being …",
# "gave up being …" and "used to be …" all read as "is …", negated.

# Words that date a statement without changing what it claims: "lives in Porto now" claims what
# "lives in Porto" claims, and "isn't vegetarian anymore" what "isn't vegetarian" claims.
_SOFT_WORDS: Final = re.compile(
    r"\b(?:now|currently|still|just|recently|finally|already|again|anymore|any\s+(?:more|longer)"
    r"|these\s+days|nowadays)\b"
)
# A time at the end of a value: "moved to Porto last month" moved to "Porto".
_TIME_TAIL: Final = re.compile(
    r"(?:\s+(?:today|yesterday|(?:last|this)\s+(?:week|month|year|spring|summer|autumn|fall|winter)"
    r"|(?:a\s+few|a|an|one|two|three|several|\d+)\s+(?:days?|weeks?|months?|years?)\s+ago"
    r"|(?:in|since)\s+\d{4}))+$"
)
# Clauses are read one by one, so a negation in one does not reach the other: "User started eating
# fish again, so they are pescatarian now" is two claims.
_CLAUSE_BREAK: Final = re.compile(r"\s*[,;]\s*|\s+(?:and|but|so|while|whereas|though|although)\s+", re.I)
_LEADING_LINK: Final = re.compile(r"^(?:and|but|so|then|yet)\s+")
_USER_SUBJECT: Final = re.compile(r"^(?:the\s+)?user\b(?!')", re.I)
# "User and others moved to Porto" (the rules distillation of "We moved …"), "User and their wife
# moved …": the user moved. Read before the clauses are split, as its "and" joins no clauses.
_USER_AND_OTHERS: Final = re.compile(r"^(?:the\s+)?user\s+and\s+(?:others|their\s+\w+|[A-Z]\w*)\b", re.I)

# The verbs of the frames below, as a frame says them ("being" → "is", "live" → "lives").
_FRAME_VERBS: Final = {
    "being": "is", "be": "is", "living": "lives", "live": "lives", "working": "works", "work": "works",
    "driving": "drives", "drive": "drives", "eating": "eats", "eat": "eats", "owning": "owns", "own": "owns",
    "having": "has", "have": "has",
}
# "stopped being vegetarian", "quit working as a nurse", "gave up eating meat", "used to live in
# Lisbon": the frame after them held once and holds no longer, so it is read negated.
_ENDED: Final = re.compile(
    r"\b(?:(?:has|had)\s+)?"
    r"(?:(?:stopped|quit|gave\s+up|given\s+up)\s+(being|living|working|driving|eating|owning|having)"
    r"|used\s+to\s+(be|live|work|drive|eat|own|have))\b"
)
# "started eating fish", "began working as a teacher": the frame after them holds from now on.
_STARTED: Final = re.compile(
    r"\b(?:(?:has|had)\s+)?(?:started|began|begun)\s+(being|living|working|driving|eating|owning|having)\b"
)

_SUBJ: Final = r"^(?P<subj>.+?)\s+"
# (predicate, pattern, whether the frame itself says "no longer"), read on top of _PREDICATES.
_CONFLICT_FRAMES: Final[list[tuple[str, re.Pattern[str], bool]]] = [
    *((predicate, pattern, False) for predicate, pattern in _PREDICATES),
    # "moved to Porto", "relocated from Lisbon to Porto": where the subject lives now. Not "moved to
    # a bigger flat" or "to their parents' house": a place name takes no "a" and no possessive.
    (
        "location",
        re.compile(
            _SUBJ + r"(?:(?:has|have)\s+)?(?:moved|relocated)\s+(?:back\s+)?(?:from\s+.+?\s+)?to\s+"
            r"(?!(?:an?|their|his|her|our)\s)(?P<val>.+?)(?:\s+from\s+.*)?$"
        ),
        False,
    ),
    # "moved away from Lisbon": lives there no longer.
    (
        "location",
        re.compile(_SUBJ + r"(?:(?:has|have)\s+)?(?:moved|relocated)\s+(?:away\s+from|out\s+of)\s+(?P<val>.+)$"),
        True,
    ),
    # "drives a blue Renault Zoe": one car at a time, as a rule (a weak one: see _differing_values_score).
    ("vehicle", re.compile(_SUBJ + r"drives?\s+(?:an?|the|their)\s+(?P<val>.+?)(?:\s+to\s+.*)?$"), False),
    # "has a dog named Rex": things held. One holds many (a dog and a cat), so only "no longer has" contradicts.
    (
        "has",
        re.compile(_SUBJ + r"(?:has|have|owns?)\s+(?:an?|the|their)\s+(?P<val>.+?)(?:\s+(?:named|called)\s+.*)?$"),
        False,
    ),
    # "eats fish": what the subject eats, read against diets (see _DIETS).
    ("eats", re.compile(_SUBJ + r"eats?\s+(?P<val>.+)$"), False),
    # "is vegetarian", "is allergic to cats": a state. Many hold at once, so only its negation contradicts.
    ("state", re.compile(_SUBJ + r"is\s+(?:an?\s+)?(?P<val>.+)$"), False),
    # "quit the nursing job", "sold the Renault Zoe", "gave up meat": whatever it was, it is over.
    (
        "given_up",
        re.compile(
            _SUBJ + r"(?:(?:has|have)\s+)?(?:quit|sold|gave\s+(?:up|away)|given\s+(?:up|away)|got\s+rid\s+of"
            r"|retired\s+from|left(?=\s+(?:their|the|a)\s+job\b))\s+(?P<val>.+)$"
        ),
        True,
    ),
]

# Slots that hold one value at a time, so two different values contradict; "has", "state" and
# "eats" hold many ("has a dog" and "has a cat"), and only their negations contradict them.
_SINGLE_VALUED: Final = frozenset(
    {"name", "age", "marital", "location", "origin", "born", "occupation", "employer", "is_a", "vehicle"}
)
# Predicates whose value is a place: the words after "in" or "at" are part of it.
_PLACE_PREDICATES: Final = frozenset({"location", "origin", "born"})
# Nouns that name a job: "User is a teacher now" says what "User works as a teacher" says. Roles
# often held beside a job (artist, writer, student, parent) are left out on purpose.
_OCCUPATIONS: Final = frozenset(
    """
    engineer developer programmer nurse doctor physician surgeon dentist pharmacist teacher professor
    lecturer lawyer attorney designer manager accountant scientist researcher architect consultant
    chef baker pilot farmer electrician plumber carpenter mechanic journalist photographer librarian
    translator therapist psychologist paramedic firefighter waiter waitress barista cashier analyst
    veterinarian midwife
    """.split()
)
# What a diet leaves out, and what it keeps that another leaves out: "is vegetarian" says "does
# not eat fish", "is pescatarian" says "eats fish", so those two contradict like any negation,
# and so does "started eating fish again". Vegan and vegetarian agree (nothing kept is left out).
_MEAT: Final = "meat chicken beef pork bacon ham lamb"
_FISH: Final = "fish seafood salmon tuna shrimp"
_DIETS: Final[dict[str, tuple[str, str]]] = {
    "vegan": ("", f"{_MEAT} {_FISH} egg dairy cheese milk butter"),
    "vegetarian": ("", f"{_MEAT} {_FISH}"),
    "pescatarian": (_FISH, _MEAT),
}
_FOODS: Final = frozenset(_stem(w) for keeps, avoids in _DIETS.values() for w in f"{keeps} {avoids}".split())
# A thing given up this general ends whatever fills these slots: "sold their car" ends "drives a
# Renault Zoe", "quit their job" ends "works as a nurse".
_GENERIC_THINGS: Final[dict[str, frozenset[str]]] = {
    "car": frozenset({"vehicle", "has"}),
    "job": frozenset({"occupation", "employer"}),
    "work": frozenset({"occupation", "employer"}),
}

_DETERMINER: Final = re.compile(r"^(?:the|a|an|their|his|her|its|our)\s+")
# "their job as a nurse", "the job at the bank", "the nursing job": what was given up is the
# nurse's work, the bank, nursing.
_JOB_OF: Final = re.compile(r"^(?:job|position|role|career)\s+(?:as|at|with)\s+")
_JOB_WORD: Final = re.compile(r"\s+(?:job|position|role|career)$")
# "nurse at a children's hospital": for roles and things, what follows "in"/"at" says where, not what.
_WHERE_TAIL: Final = re.compile(r"\s+(?:in|at|on|near)\s+.*$")


def _frame_value(raw: str, predicate: str) -> str:
    """The value of a frame without articles, times and trailing clauses ("the Zoe last week" → "zoe")."""
    value = _DETERMINER.sub("", raw.strip(" .!?\"'"))
    if predicate == "given_up":
        value = _DETERMINER.sub("", _JOB_OF.sub("", value))
    value = _TIME_TAIL.sub("", _VALUE_END.split(value, maxsplit=1)[0])
    if predicate not in _PLACE_PREDICATES:
        value = _WHERE_TAIL.sub("", value)
    if predicate == "given_up":
        value = _JOB_WORD.sub("", value)
    return value.strip(" .!?\"'")


def _frame_subject(subject: str) -> str:
    """Whom a claim is about: "the user" is the user."""
    return re.sub(r"^the\s+user\b", "user", " ".join(subject.split()))


def _as_users(clause: str) -> str:
    """A clause that continues a sentence about the user, with "user" as its subject.

    "they are pescatarian" → "user is pescatarian", "moved to Porto" → "user moved to Porto"; a
    clause with another subject ("their sister lives in Rome") gets a subject that matches no claim
    of the user's ("user their sister"), which is what it should match.
    """
    if _USER_SUBJECT.match(clause):
        return clause
    they = re.match(r"they(?:\s+|')(\S+)\s*", clause)
    if they is None:
        return "user " + clause
    verb = {"are": "is", "re": "is", "have": "has", "ve": "has", "were": "was"}.get(they.group(1))
    return f"user {verb or _third_person_verb(they.group(1))} {clause[they.end():]}".strip()


def _undo_change(clause: str) -> tuple[str, bool]:
    """The clause with a change read as its plain frame, and whether the change ended the frame.

    "user stopped being vegetarian" → ("user is vegetarian", True); "user started eating fish" →
    ("user eats fish", False).
    """
    for pattern, ended in ((_ENDED, True), (_STARTED, False)):
        match = pattern.search(clause)
        if match:
            verb = _FRAME_VERBS[match.group(1) or match.group(2)] if ended else _FRAME_VERBS[match.group(1)]
            return clause[: match.start()] + verb + clause[match.end() :], ended
    return clause, False


def _frame_claims(clause: str, negated: bool) -> list[_Claim]:
    """Every claim of one plain, lower-case clause; several frames may read it ("is a nurse" is a state too)."""
    claims: list[_Claim] = []
    for predicate, pattern, ends in _CONFLICT_FRAMES:
        match = pattern.match(clause)
        if match is None:
            continue
        subject, value = _frame_subject(match.group("subj")), _frame_value(match.group("val"), predicate)
        no_longer = negated != ends  # "did not quit the job" says the job goes on
        if not value or (predicate == "given_up" and not no_longer):
            continue
        if predicate == "is_a" and value.split()[-1] in _OCCUPATIONS:
            predicate = "occupation"
        if predicate == "eats":
            foods = sorted({_stem(w) for w in _words(value)} & _FOODS)
            claims.extend(_Claim(subject, "eats", food, no_longer) for food in foods)
            continue
        claims.append(_Claim(subject, predicate, value, no_longer))
        if predicate == "state" and not no_longer and value in _DIETS:
            keeps, avoids = _DIETS[value]
            claims.extend(_Claim(subject, "eats", _stem(w), False) for w in keeps.split())
            claims.extend(_Claim(subject, "eats", _stem(w), True) for w in avoids.split())
    return claims


def _clauses(sentence: str) -> list[str]:
    """The clauses of one sentence, in the third person ("I live in Lisbon" → "User lives in Lisbon")."""
    sentence = _USER_AND_OTHERS.sub("User", (_rewrite_subject(sentence) or sentence).strip())
    return [clause.strip() for clause in _CLAUSE_BREAK.split(sentence) if clause.strip()]


def _conflict_claims(text: str) -> list[_Claim]:
    """The claims of ``text``, clause by clause, for conflict scoring."""
    claims: list[_Claim] = []
    for sentence in _sentences_of(text):
        clauses = _clauses(sentence)
        about_user = bool(clauses) and _USER_SUBJECT.match(clauses[0]) is not None
        for index, clause in enumerate(clauses):
            plain, negated = _negation_free(clause)
            plain = _LEADING_LINK.sub("", plain)
            if index and about_user:
                plain = _as_users(plain)
            plain, ended = _undo_change(" ".join(_SOFT_WORDS.sub(" ", plain).split()))
            claims.extend(_frame_claims(plain, negated != ended))  # "hasn't stopped being X" is X
    return claims


def _stems(value: str) -> list[str]:
    """Stemmed content words of a value, in order."""
    return [_stem(w) for w in _words(value) if w not in _STOP_WORDS]


def _same_thing(a: str, b: str) -> bool:
    """Whether two values name the same thing, as a paraphrase would.

    Besides :func:`_same_value` ("berlin" / "berlin germany"): the same last word, and all words of
    one in the other — "blue renault zoe" / "zoe", "pediatric nurse" / "nursing"; but "data engineer"
    and "software engineer" differ.
    """
    if _same_value(a, b):
        return True
    words_a, words_b = _stems(a), _stems(b)
    if not words_a or not words_b or words_a[-1] != words_b[-1]:
        return False
    return set(words_a) <= set(words_b) or set(words_b) <= set(words_a)


def _unsays(negative: _Claim, positive: _Claim) -> bool:
    """Whether the negated claim denies the positive one (same subject assumed)."""
    if negative.predicate == "given_up":
        # A thing given up ends whatever held it ("sold the Zoe" ends "drives a blue Renault Zoe"),
        # but not a state that names it ("is proud of the Zoe").
        if positive.predicate == "state":
            return False
        if negative.value in _GENERIC_THINGS:
            return positive.predicate in _GENERIC_THINGS[negative.value]
    elif negative.predicate != positive.predicate:
        return False
    return _same_thing(negative.value, positive.value)


def _claims_conflict(a: _Claim, b: _Claim) -> float:
    """Contradiction score of two claims: 0.9 for a negation, about 0.8 for a replaced value, else 0."""
    if a.subject != b.subject:
        return 0.0
    if a.negated != b.negated:
        negative, positive = (a, b) if a.negated else (b, a)
        return 0.9 if _unsays(negative, positive) else 0.0
    if a.negated or a.predicate != b.predicate or a.predicate not in _SINGLE_VALUED:
        return 0.0
    return 0.0 if _same_thing(a.value, b.value) else _differing_values_score(a, b)


# The offline provider's name: shown as the evaluator, and how callers tell it from a real LLM.
RULES_PROVIDER_NAME: Final = "rules"


class RulesProvider:
    """Deterministic, offline :class:`~yak_pipeline.llm.provider.LLMProvider` stand-in (see the module docstring).

    Stateless, so thread-safe. Results carry stats with ``attempts=1`` and no token counts.
    """

    name = RULES_PROVIDER_NAME

    def __repr__(self) -> str:
        return "RulesProvider()"

    @staticmethod
    def _stats(started: float) -> LLMCallStats:
        """Stats of a rules call: its latency, one attempt, no tokens, answered by the rules."""
        return LLMCallStats(
            latency_ms=(time.perf_counter() - started) * 1000.0, prompt_tokens=None, completion_tokens=None, attempts=1,
            model=RULES_PROVIDER_NAME,
        )

    def distill(self, exchange: str) -> DistillationResult:
        """Third-person statements from the user's first-person sentences (see the module docstring)."""
        started = time.perf_counter()
        if not exchange.strip():
            raise ValueError("cannot distil an empty exchange")
        user_text = user_part(exchange)
        if not user_text:
            content = "User sent an empty message."
            return DistillationResult(content=content, confidence=SUMMARY_CONFIDENCE, tier="low", stats=self._stats(started))
        statements: list[_Statement] = []
        seen: set[str] = set()
        for sentence in _sentences_of(user_text):
            statement = _statement(sentence)
            if statement is None or _normalised(statement.text) in seen:
                continue
            seen.add(_normalised(statement.text))
            statements.append(statement)
        if statements:
            # Keep the four most important statements, then restore the user's order.
            ranked = sorted(
                range(len(statements)),
                key=lambda i: (_TIER_ORDER[_tier([statements[i].original, statements[i].text])], i),
            )
            kept = [statements[i] for i in sorted(ranked[:MAX_SENTENCES])]
            content = _valid_text([s.text for s in kept], user_text)
            confidence = HEDGED_CONFIDENCE if any(s.hedged for s in kept) else DIRECT_CONFIDENCE
            tier = _tier([s.original for s in kept] + [s.text for s in kept])
        else:
            summary, informative = _summary(user_text)
            content = _valid_text([summary], user_text)
            # A faithful quote of what the user reported is worth recalling, but it is not distilled:
            # the middle band of the gate (active, needs_review) says exactly that.
            confidence = QUOTE_CONFIDENCE if informative else SUMMARY_CONFIDENCE
            tier = _tier([user_text])
        return DistillationResult(content=content, confidence=confidence, tier=tier, stats=self._stats(started))

    def consolidate(self, older: str, newer: str) -> ConsolidationResult:
        """Newer's sentences, then older's that are new and not superseded, capped at 4."""
        started = time.perf_counter()
        newer_sentences = [_finish(s) for s in _sentences_of(newer) if _TRAILING_PUNCT.sub("", s)]
        older_sentences = [_finish(s) for s in _sentences_of(older) if _TRAILING_PUNCT.sub("", s)]
        if not newer.strip() and not older.strip():
            raise ValueError("cannot consolidate two empty texts")
        merged = list(newer_sentences)
        seen = {_normalised(s) for s in merged}
        newer_claims = _claims(newer)
        newer_keys = {(c.subject, c.predicate) for c in newer_claims if c.predicate != "is_a"}
        for sentence in older_sentences:
            if len(merged) >= MAX_SENTENCES:
                break
            if _normalised(sentence) in seen:
                continue
            # The newer memory wins: "User lives in Paris" supersedes an older "User lives in Berlin".
            # An older sentence that only repeats the same value is dropped when it adds no words.
            claims = _claims(sentence)
            if any((c.subject, c.predicate) in newer_keys and not _same_value_in(c, newer_claims) for c in claims):
                continue
            if content_words(sentence) <= content_words(" ".join(merged)):
                continue
            merged.append(sentence)
            seen.add(_normalised(sentence))
        content = _valid_text(merged[:MAX_SENTENCES], newer if newer.strip() else older)
        return ConsolidationResult(content=content, stats=self._stats(started))

    def conflict_score(self, a: str, b: str) -> ScoreResult:
        """Contradiction heuristic over predicates and negation (see the module docstring); symmetric."""
        started = time.perf_counter()
        claims_b = _conflict_claims(b)
        score = max((_claims_conflict(x, y) for x in _conflict_claims(a) for y in claims_b), default=0.0)
        # Then the word-overlap check, clause by clause: "User lives in Lisbon and does not own a car"
        # negates nothing of "User lives in Lisbon".
        clauses_a = [clause for sentence in _sentences_of(a) for clause in _clauses(sentence)]
        clauses_b = [clause for sentence in _sentences_of(b) for clause in _clauses(sentence)]
        for clause_a in clauses_a:
            for clause_b in clauses_b:
                score = max(score, _sentence_conflict(clause_a, clause_b))
        return ScoreResult(score=score, stats=self._stats(started))

    def relevance_score(self, memory: str, context: str) -> ScoreResult:
        """Overlap coefficient of content words, ``|M ∩ C| / min(|M|, |C|)``, in [0, 1]."""
        started = time.perf_counter()
        memory_words, context_words = content_words(memory), content_words(context)
        if not memory_words or not context_words:
            score = 0.0
        else:
            score = len(memory_words & context_words) / min(len(memory_words), len(context_words))
        return ScoreResult(score=round(score, 4), stats=self._stats(started))
