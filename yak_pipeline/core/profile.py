"""The user's profile: standing instructions and preferences, read from their own words.

"Always format code snippets with syntax highlighting", "never use jargon", "I prefer minimal
dependencies": such a statement should shape every later answer, and the later question ("show
me how to implement login") does not mention it, so similarity recall never brings it (issue 39).
Yak therefore keeps, beside the recalled memories, a profile: every sentence of the user's side
of an exchange that states how they want to be answered (``instruction``) or what they prefer
(``preference``), found by the patterns below when the exchange is stored — from the user's own
words, so it needs no distiller and is there at once. The memory block carries the profile on
every turn, within its own token budget (:func:`choose_profile`), apart from the recalled part.

The patterns are plain English, deliberately few and strict: a profile line is sent with every
prompt, so a false one costs on every turn, while a missed one is still found by recall when the
question is about it. An instruction is a sentence that *starts* as an order ("Always …",
"Never …", "From now on …", "Please always …", "I want you to always …"); a preference is the
clause of a sentence in which the user says they prefer something ("I prefer …", "I'd rather …",
"my preference is …"), cut at the clause's end so a long message contributes one short line.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Literal

from yak_pipeline.core.block_choice import line_tokens
from yak_pipeline.core.sentences import split_sentences

ProfileKind = Literal["instruction", "preference"]
PROFILE_KINDS: Final[tuple[ProfileKind, ...]] = ("instruction", "preference")

# A profile line never runs longer than this many words (then it ends with "…").
MAX_LINE_WORDS: Final = 40

_LEAD: Final = r"(?:(?:please|ok(?:ay)?|also|and|so|oh|hey|remember to|make sure (?:to|you)|from now on|going forward|" \
               r"in (?:the )?future)[,:]?\s+)*"
# What an order to the assistant does: answer, use, include, format… ("Always here to help",
# "Never had a chance" are not orders).
_ANSWER_VERBS: Final = (
    r"(?:answer|reply|respond|use|include|format|provide|give|show|write|keep|explain|mention|add|start|end|cite|"
    r"list|sort|put|call|address|ask|check|confirm|double-check|remind|tell|suggest|recommend|highlight|specify|"
    r"report|maintain|tailor|offer|be|talk|speak|summari[sz]e|spell|avoid|translate|convert|express|present|label|"
    r"quote|round|number|break|structure|organi[sz]e|assume|default|reference|link|note|warn|flag|display|state|"
    r"double|consider|prioriti[sz]e|focus|stick|limit|return|respect|refer|compare|describe|indicate|"
    r"follow|omit|skip|leave|send|make|stay|go|take)")
_INSTRUCTION: Final = re.compile(
    _LEAD + r"(?:(?:always|never)\s+(?:\w+ly\s+)?" + _ANSWER_VERBS + r"|"
    r"(?:from now on|going forward|in (?:the )?future),?\s+(?:please\s+)?(?:always\s+|never\s+|don't\s+|do not\s+)?"
    + _ANSWER_VERBS + r"|"
    r"(?:i want|i'd like|i would like|i need) you to (?:always|never)\s+(?:\w+ly\s+)?" + _ANSWER_VERBS + r")\b",
    re.IGNORECASE)
_PREFERENCE: Final = re.compile(
    r"\b(?:I(?:'d| would)?(?: \w+ly)? prefer(?:red)?|my (?:strong |personal |general )?preference (?:is|for|would be)|"
    r"I(?:'d| would) rather)\b", re.IGNORECASE)
# "Would I prefer …?", "Do you think I'd prefer …": a question about a preference states none.
_ASKED: Final = re.compile(r"\b(?:do|does|did|would|should|will|could|can|might)\s+(?:\w+\s+)?I(?:'d)?(?:\s+\w+ly)?\s+(?:prefer|rather)\b",
                           re.IGNORECASE)
# Where a preference's clause ends: a question or another request after a comma, or the sentence's end.
_CLAUSE_END: Final = re.compile(
    r"[?!;]|\.(?:\s|$)|,\s+(?=(?:how|can|could|would|what|which|where|why|when|so|but|do|does|is|are|any|"
    r"please|though|if|and (?:I|can|could|how|what|would)|I'm|I am|I want|I need)\b)",
    re.IGNORECASE)
# Code, markup or a table: not how a person states a preference.
_CODE_LIKE: Final = re.compile(r"[`{}<>=|\\]|\b(?:def|import|return|const|function)\s")


@dataclass(frozen=True)
class ProfileStatement:
    """One line of the profile as found in the user's words: what kind, its text, its position."""

    kind: ProfileKind
    text: str
    # The sentence's place in the message, so a message's lines keep their order (and a key).
    position: int


@dataclass(frozen=True)
class ProfileLine:
    """A stored profile line, as the block and the profile views use it."""

    id: str
    memory_id: str
    kind: ProfileKind
    text: str
    said_at: datetime
    # The user took it out of the profile (the exchange stays a memory).
    dropped: bool = False


def _capped(text: str) -> str:
    words = text.split()
    text = " ".join(words[:MAX_LINE_WORDS])
    return text + "…" if len(words) > MAX_LINE_WORDS else text


def _preference_clause(sentence: str, start: int) -> str:
    end = _CLAUSE_END.search(sentence, start + 1)
    clause = sentence[start:end.start() if end else len(sentence)].strip(" ,;:-")
    return clause[0].upper() + clause[1:] if clause else clause


def profile_statements(said: str) -> list[ProfileStatement]:
    """The instructions and preferences stated in ``said`` (the user's side of an exchange), in order.

    A sentence that starts as an order is an instruction, whole (capped at :data:`MAX_LINE_WORDS`);
    otherwise a sentence in which the user says they prefer something gives its preference clause.
    Questions about a preference, and code, give nothing."""
    found: list[ProfileStatement] = []
    for position, sentence in enumerate(split_sentences(said)):
        if _CODE_LIKE.search(sentence):
            continue
        if _INSTRUCTION.match(sentence):
            found.append(ProfileStatement("instruction", _capped(sentence), position))
            continue
        match = _PREFERENCE.search(sentence)
        if match is None or _ASKED.search(sentence):
            continue
        clause = _preference_clause(sentence, match.start())
        if len(clause.split()) >= 3:
            found.append(ProfileStatement("preference", _capped(clause), position))
    return found


_REFERENCE: Final = re.compile(r"^(?:(that|this|the|my)\s+)?(?:(last|latest|newest)\s+)?(instruction|preference)(s)?$",
                               re.IGNORECASE)


def profile_reference(phrase: str) -> tuple[ProfileKind, bool] | None:
    """What a forget phrase such as "that preference" or "my instructions" points at: the kind of
    profile line and whether it means every one (a plural) or only the newest; None for any other
    phrase (then the phrase is looked for in the memories' text)."""
    match = _REFERENCE.match(" ".join(phrase.split()).strip(" .!?"))
    if match is None:
        return None
    kind: ProfileKind = "instruction" if match.group(3).lower() == "instruction" else "preference"
    return kind, bool(match.group(4))


def _same(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.casefold()).split())


def choose_profile(lines: Sequence[ProfileLine], token_budget: int) -> list[ProfileLine]:
    """The profile lines the block carries: instructions first, then preferences, each newest first,
    one line per wording (the newest), while they fit ``token_budget`` tokens (estimated as the
    block shows them, ``core.block_choice.line_tokens``; a longer line is skipped, a shorter one
    after it may still fit). A budget of 0 carries none: the profile is off."""
    if token_budget <= 0:
        return []
    ordered = sorted(lines, key=lambda line: (PROFILE_KINDS.index(line.kind), -line.said_at.timestamp(), line.id))
    seen: set[str] = set()
    unique = []
    for line in ordered:
        if (wording := _same(line.text)) not in seen:
            seen.add(wording)
            unique.append(line)
    kept, used = [], 0
    for line in unique:
        # Unlike the recalled part, whose first memory always goes in, a profile keeps only what fits.
        if used + (tokens := line_tokens(line.text)) <= token_budget:
            kept.append(line)
            used += tokens
    return kept
