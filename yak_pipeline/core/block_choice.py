"""Which recalled memories go into the block: only what answers, within a token budget (DESIGN §4).

Recall ranks up to ``limit`` memories that pass the gate; the block takes from them only those
whose own evidence says they answer as well as the best one nearly does. A fixed size fills
the block with unrelated private facts once one memory passes (a question about a drink brought
the vegetarian diet, Radiohead and running along); the evidence decides instead, so a one-fact
question gets one or two lines and a question whose answer is spread over several memories
gets them all.

The cut is an *odds gap*: a memory joins when its rank odds (``core.recall``: the standing's
odds to the exponent e, times decay, warmth and gravity) are within ``odds_gap`` of the best's on
the standing's logit scale, i.e. ``(ln odds_best − ln odds_i) / e ≤ odds_gap``. On that scale one
unit is a factor e ≈ 2.7 in the standing's odds, whatever the exponent, and the priors count as
they do in the order. The gap was chosen on the dev files, cross-validated (docs/RECALL.md).

The block keeps recall's order: a memory that recall placed above one that joins also joins,
whatever its own odds. Recall moves some memories up past better odds on purpose (the current
fact before the one it replaced; a question about the present gets the newest first); cutting
by odds alone dropped exactly those and kept the outdated statement they were moved above.

Then a token budget bounds the block: memories are taken in order while their lines fit (the
first always is; :func:`fit_text` cuts a text longer than the budget), so a long exchange cannot
crowd out the rest of the prompt. Tokens are estimated at four characters each (English prose with a
common tokenizer; a bound, not a count).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

from yak_pipeline.core.query_intent import asks_about_present, asks_to_gather

# Characters per token, for the budget's estimate.
CHARS_PER_TOKEN: Final[float] = 4.0
# What a block line adds to its memory's text: "- (distilled memory, said on 27 Nov 2026) ".
LABEL_TOKENS: Final[int] = 12


@dataclass(frozen=True)
class BlockChoice:
    """How the block is chosen from the ranked memories: the odds gap to the best (None: every
    memory recall returned), and the token budget of the memory lines (0: no budget); and the
    token budget of the profile part (``core.profile.choose_profile``; 0: no profile); and how many
    memories a question that gathers (``core.query_intent.asks_to_gather``) may get (0: none more)."""

    odds_gap: float | None = 2.0
    token_budget: int = 600
    profile_tokens: int = 300
    gather_limit: int = 10

    def __post_init__(self) -> None:
        if self.odds_gap is not None and not (self.odds_gap >= 0 and math.isfinite(self.odds_gap)):
            raise ValueError(f"odds_gap must be a finite number >= 0 or None, got {self.odds_gap!r}")
        if self.token_budget < 0:
            raise ValueError(f"token_budget must be >= 0, got {self.token_budget}")
        if self.gather_limit < 0:
            raise ValueError(f"gather_limit must be >= 0, got {self.gather_limit}")
        if self.profile_tokens < 0:
            raise ValueError(f"profile_tokens must be >= 0, got {self.profile_tokens}")


def estimated_tokens(text: str) -> int:
    """A bound on the tokens of ``text`` (four characters a token, at least one)."""
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def line_tokens(text: str) -> int:
    """A bound on the tokens of the block line showing a memory of ``text`` (its label included)."""
    return estimated_tokens(text) + LABEL_TOKENS


def within_odds_gap(log_rank_odds: Sequence[float], *, exponent: float, odds_gap: float | None) -> list[bool]:
    """For each memory (in recall order, given by the logarithm of its rank odds,
    ``core.recall.RankedMemory.log_rank_odds``), whether it joins: its rank odds are within
    ``odds_gap`` of the best's on the standing's logit scale, or recall placed it above one whose
    odds are (module docstring); every one when ``odds_gap`` is None."""
    if odds_gap is None or not log_rank_odds:
        return [True] * len(log_rank_odds)
    best = max(log_rank_odds)
    if best == -math.inf:
        return [True] * len(log_rank_odds)
    limit = best - odds_gap * exponent
    own = [log_odds > -math.inf and log_odds >= limit - 1e-12 for log_odds in log_rank_odds]
    last = max(i for i, near in enumerate(own) if near)
    return [i <= last for i in range(len(log_rank_odds))]


def within_token_budget(line_tokens: Sequence[int], token_budget: int) -> list[int]:
    """The indices (in order) of the lines that fit ``token_budget`` tokens, taken in order (the first
    always; a later one that does not fit is skipped, a shorter one after it may still fit; 0: all)."""
    kept: list[int] = []
    used = 0
    for index, tokens in enumerate(line_tokens):
        if kept and token_budget and used + tokens > token_budget:
            continue
        kept.append(index)
        used += tokens
    return kept


def choose_block(log_rank_odds: Sequence[float], tokens: Sequence[int], *, exponent: float, choice: BlockChoice,
                 superseded: Sequence[bool] | None = None) -> list[int]:
    """The indices (in order) of the memories the block holds (each given by the logarithm of its
    rank odds, as :func:`within_odds_gap`): within the odds gap, then without the
    ``superseded`` ones (those a newer memory replaced; pass None when history is asked for), then
    while their lines (``tokens`` each) fit the token budget (the first kept always).

    ``services.recall.build_context`` applies the same three steps, with a follow-up's extra recalls
    added after the gap; ``yak eval`` measures the block with this function."""
    if len(log_rank_odds) != len(tokens) or superseded is not None and len(superseded) != len(tokens):
        raise ValueError("one token count (and superseded flag) per memory is needed")
    near = [i for i, keep in enumerate(within_odds_gap(log_rank_odds, exponent=exponent, odds_gap=choice.odds_gap))
            if keep and not (superseded is not None and superseded[i])]
    return [near[i] for i in within_token_budget([tokens[i] for i in near], choice.token_budget)]


def fit_text(text: str, token_budget: int) -> str:
    """``text`` cut at a word to fit ``token_budget`` tokens, with "…" (unchanged when it fits or no budget)."""
    limit = int(token_budget * CHARS_PER_TOKEN)
    if not token_budget or len(text) <= limit:
        return text
    cut = text[: max(limit - 1, 1)]
    return (cut.rsplit(" ", 1)[0] if " " in cut[limit // 2:] else cut).rstrip() + "…"


def gathers(question: str, choice: BlockChoice) -> bool:
    """Whether the block for ``question`` gathers (``core.query_intent.asks_to_gather``): up to
    ``choice.gather_limit`` memories, no odds gap, newest first. A question about
    the present ("how many … now") is not one: it wants the current value, first."""
    return choice.gather_limit > 0 and asks_to_gather(question) and not asks_about_present(question)


@dataclass(frozen=True)
class BlockShape:
    """How one question's block is cut: how many memories recall is asked for, the choice that cuts
    them (no odds gap for a question that gathers), and whether they go newest first."""

    limit: int
    choice: BlockChoice
    newest_first: bool = False


def block_shape(question: str, limit: int, choice: BlockChoice) -> BlockShape:
    """The block's shape for ``question`` (``services.recall.build_context`` and ``yak eval`` alike):
    ``limit`` memories cut by ``choice``, or, for a question that :func:`gathers`, up to
    ``choice.gather_limit`` of them, every one recall finds relevant (no odds gap), newest first."""
    if not gathers(question, choice):
        return BlockShape(limit, choice)
    return BlockShape(max(limit, choice.gather_limit), replace(choice, odds_gap=None), newest_first=True)
