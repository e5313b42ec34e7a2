"""How the rules provider distils: confidence bands, the keyword tier, and the quote used when the user
stated nothing that the rewriter (:mod:`.english`) could turn into a statement.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from yak_pipeline.core.sentences import count_sentences
from yak_pipeline.core.types import Tier
from yak_pipeline.llm.models import MAX_CONTENT_CHARS, MAX_SENTENCES
from yak_pipeline.llm.rules.english import clip
from yak_pipeline.llm.rules.words import TRAILING_PUNCT, content_words, sentences_of, words_of

DIRECT_CONFIDENCE: Final = 0.9


HEDGED_CONFIDENCE: Final = 0.65


SUMMARY_CONFIDENCE: Final = 0.5


QUOTE_CONFIDENCE: Final = 0.7


# A quote needs this many content words to count as reporting something ("Thanks, that's great!" does not).
_QUOTE_MIN_CONTENT_WORDS: Final = 5


_SUMMARY_QUOTE_CHARS: Final = 200


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


def tier_of(texts: Iterable[str]) -> Tier:
    """Keyword tier of a distillation: identity/location/occupation/family/health → core, preferences → medium."""
    texts_list = list(texts)
    joined = " ".join(texts_list)
    words = set(words_of(joined))
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


TIER_ORDER: Final[dict[Tier, int]] = {"core": 0, "medium": 1, "low": 2}


def valid_text(sentences: list[str], fallback_source: str) -> str:
    """Join sentences into a text that is 1–4 sentences and within the length limit, whatever the input.

    Joining can merge two sentences (an abbreviation at the end of one), never split one; the final
    check is still made, with a word-only fallback, so arbitrary input cannot yield invalid output.
    """
    text = " ".join(sentences)
    if 1 <= count_sentences(text) <= MAX_SENTENCES and len(text) <= MAX_CONTENT_CHARS:
        return text
    words = re.sub(r"[.!?…]+", " ", fallback_source).split()
    quote = clip(" ".join(words), _SUMMARY_QUOTE_CHARS)
    return f"User said: {quote.rstrip('.')}." if quote else "User sent a message without words."


def _informative(sentence: str) -> bool:
    """A sentence that reports something: not a question, with enough content words to be more than chat."""
    words = [w for w in content_words(sentence) if any(c.isalpha() for c in w)]
    return not sentence.rstrip(" \"')").endswith("?") and len(words) >= _QUOTE_MIN_CONTENT_WORDS


def summarise(user_text: str) -> tuple[str, bool]:
    """One sentence saying what the user said or asked, and whether it quotes something informative.

    The quote starts at the user's first informative sentence (greetings, thanks and questions
    before it are skipped) and runs on through the informative sentences after it, up to the quote
    length, as one sentence; with none, it quotes the start of the first sentence.
    """
    sentences = [" ".join(s.split()) for s in sentences_of(user_text)]
    sentences = [s for s in sentences if s]
    if not sentences:
        return "User sent an empty message.", False
    informative = [s for s in sentences if _informative(s)]
    if informative:
        # Joined with semicolons so the quote stays one sentence of the distillation.
        quote = clip("; ".join(TRAILING_PUNCT.sub("", s) for s in informative), _SUMMARY_QUOTE_CHARS)
        return "User said: " + quote + ("" if quote.endswith("...") else "."), True
    first = clip(sentences[0], _SUMMARY_QUOTE_CHARS)
    if first.endswith("?"):
        return "User asked: " + first, False
    return "User said: " + TRAILING_PUNCT.sub("", first) + ("" if first.endswith("...") else "."), False
