"""Conflict scoring: each clause reduced to a plain frame ("User is vegetarian") and whether it is negated,
then claims about the same subject compared (see the package docstring for the scores).
"""

from __future__ import annotations

import re
from typing import Final

from yak_pipeline.llm.rules.claims import PREDICATES, VALUE_END, Claim, differing_values_score, same_value
from yak_pipeline.llm.rules.english import rewrite_subject, third_person_verb
from yak_pipeline.llm.rules.words import STOP_WORDS, negation_free, sentences_of, stem, words_of

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


# (predicate, pattern, whether the frame itself says "no longer"), read on top of PREDICATES.
_CONFLICT_FRAMES: Final[list[tuple[str, re.Pattern[str], bool]]] = [
    *((predicate, pattern, False) for predicate, pattern in PREDICATES),
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
    # "drives a blue Renault Zoe": one car at a time, as a rule (a weak one: see differing_values_score).
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


_FOODS: Final = frozenset(stem(w) for keeps, avoids in _DIETS.values() for w in f"{keeps} {avoids}".split())


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
    value = _TIME_TAIL.sub("", VALUE_END.split(value, maxsplit=1)[0])
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
    return f"user {verb or third_person_verb(they.group(1))} {clause[they.end():]}".strip()


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


def _frame_claims(clause: str, negated: bool) -> list[Claim]:
    """Every claim of one plain, lower-case clause; several frames may read it ("is a nurse" is a state too)."""
    claims: list[Claim] = []
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
            foods = sorted({stem(w) for w in words_of(value)} & _FOODS)
            claims.extend(Claim(subject, "eats", food, no_longer) for food in foods)
            continue
        claims.append(Claim(subject, predicate, value, no_longer))
        if predicate == "state" and not no_longer and value in _DIETS:
            keeps, avoids = _DIETS[value]
            claims.extend(Claim(subject, "eats", stem(w), False) for w in keeps.split())
            claims.extend(Claim(subject, "eats", stem(w), True) for w in avoids.split())
    return claims


def clauses_of(sentence: str) -> list[str]:
    """The clauses of one sentence, in the third person ("I live in Lisbon" → "User lives in Lisbon")."""
    sentence = _USER_AND_OTHERS.sub("User", (rewrite_subject(sentence) or sentence).strip())
    return [clause.strip() for clause in _CLAUSE_BREAK.split(sentence) if clause.strip()]


def conflict_claims(text: str) -> list[Claim]:
    """The claims of ``text``, clause by clause, for conflict scoring."""
    claims: list[Claim] = []
    for sentence in sentences_of(text):
        clauses = clauses_of(sentence)
        about_user = bool(clauses) and _USER_SUBJECT.match(clauses[0]) is not None
        for index, clause in enumerate(clauses):
            plain, negated = negation_free(clause)
            plain = _LEADING_LINK.sub("", plain)
            if index and about_user:
                plain = _as_users(plain)
            plain, ended = _undo_change(" ".join(_SOFT_WORDS.sub(" ", plain).split()))
            claims.extend(_frame_claims(plain, negated != ended))  # "hasn't stopped being X" is X
    return claims


def _stems(value: str) -> list[str]:
    """Stemmed content words of a value, in order."""
    return [stem(w) for w in words_of(value) if w not in STOP_WORDS]


def _same_thing(a: str, b: str) -> bool:
    """Whether two values name the same thing, as a paraphrase would.

    Besides :func:`same_value` ("berlin" / "berlin germany"): the same last word, and all words of
    one in the other — "blue renault zoe" / "zoe", "pediatric nurse" / "nursing"; but "data engineer"
    and "software engineer" differ.
    """
    if same_value(a, b):
        return True
    words_a, words_b = _stems(a), _stems(b)
    if not words_a or not words_b or words_a[-1] != words_b[-1]:
        return False
    return set(words_a) <= set(words_b) or set(words_b) <= set(words_a)


def _unsays(negative: Claim, positive: Claim) -> bool:
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


def claims_conflict(a: Claim, b: Claim) -> float:
    """Contradiction score of two claims: 0.9 for a negation, about 0.8 for a replaced value, else 0."""
    if a.subject != b.subject:
        return 0.0
    if a.negated != b.negated:
        negative, positive = (a, b) if a.negated else (b, a)
        return 0.9 if _unsays(negative, positive) else 0.0
    if a.negated or a.predicate != b.predicate or a.predicate not in _SINGLE_VALUED:
        return 0.0
    return 0.0 if _same_thing(a.value, b.value) else differing_values_score(a, b)
