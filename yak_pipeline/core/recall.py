"""The recall ranking (DESIGN §4 as refined in docs/RECALL.md): relevance, tier gate, score, order.

This is the one definition of what recall returns. ``store.recall`` only gathers candidates and
their signals (every leg: BM25 and vectors over distillations and exchanges); everything after
that — calibrated relevance, the tier-scaled gate, the score and the order — happens here, in
pure code that the tests use as the reference for the SQL path.

For each candidate:

1. ``relevance`` — the calibrated relevance in [0, 1] (``core.relevance``): the memory's
   *standing* among the user's memories times the query's *answerability*;
2. the gate, on each factor: the query must be answerable (``answerability ≥ t``: a question
   nothing the user said comes close to is not answered by the least-bad memory), and the
   memory's standing must pass its tier's gate, ``1 − standing ≤ (1 − t) × m_tier``
   (``core.scoring.passes_tier_gate``: with the default ``t = 0.7`` a medium memory needs ≥ 0.7,
   a core one ≥ 0.4, a low one ≥ 0.85). The tier widens or narrows what counts as *the answer*;
   it does not make an unanswerable question answerable. Nothing passes → nothing is recalled;
3. ``score = odds(standing)^e × decay × (1 + warmth) × gravity × f_superseded`` with
   ``odds(r) = r / (1 − r)``: within one query the answerability is a constant, so the order
   is the standing's (and moving the standing's operating point moves only the gate, never the
   order). Decay, warmth and gravity are *priors* on a memory's usefulness,
   and priors multiply the odds of the evidence, not its probability (Bayes): on the
   probability scale a relevance of 0.99 and one of 0.9 differ by 10 %, so a month of decay
   (×0.5) would decide between them, while their odds differ elevenfold. ``e`` (the relevance
   exponent, default 30) sets how much the query's evidence outweighs the priors: with 9, a
   30-day half-life pushed months-old evidence out of long histories (paraphrase Recall@10 0.906
   against 0.933 with 30, cross-validated; docs/RECALL.md), while recency and warmth still order
   memories of near-equal relevance. ``f_superseded`` (default 0.5) puts a memory that a newer one replaced below
   that newer one at equal relevance. The score is computed as its logarithm, the sum of the
   factors' (``e × logit(standing) + ln decay + …``): the product passes the largest float
   once ``e × logit`` passes 709 (exponent 100 and a standing of 0.9992), and the order must not
   depend on whether it does;
4. order by score, then relevance, then id (stable);
5. for a question about the present (``core.query_intent``: "Which town do I live in now?"),
   the first :data:`PRESENT_WINDOW` memories — the memory block's default size — are then
   ordered newest first (by when each was last refreshed). Relevance chooses which memories
   answer; the latest of them is the current value, and a model reading the block meets it
   first (each line also carries its date, and a superseded one says so). Measured on the
   paraphrase file's knowledge updates: docs/RECALL.md;
6. unless the question asks about the past, a memory among the first :data:`UPDATE_WINDOW` whose
   words announce a new value ("has now reached 165", "the new deadline"; ``core.updates``) moves
   ahead of the older memories above it that announce none (:func:`updates_first`): a change is
   often said without the old value, so the conflict check never pairs them;
7. last, a superseded memory listed above the memory that replaced it moves to just after it
   (:func:`current_before_superseded`): the current fact always leads.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Final, Literal

from yak_pipeline.core.relevance import RelevanceModel, RelevanceSignals, relevance_features, sigmoid
from yak_pipeline.core.scoring import DEFAULT_CORE_MULTIPLIER, GATE_EPSILON, gravity, log_decay_factor, passes_tier_gate
from yak_pipeline.core.types import TIERS, Tier
from yak_pipeline.core.updates import announces_update

# What a recalled memory is: a distillation (the LLM's refinement of an exchange, gated by its
# confidence), or an exchange no active distillation holds, recalled as the user's own words
# (pending, in review, rejected by the gate, failed, or never distilled: DESIGN §4).
MemoryKind = Literal["distilled", "raw"]
MEMORY_KINDS: Final[tuple[MemoryKind, ...]] = ("distilled", "raw")
Leg = Literal["distillation_text", "distillation_vector", "exchange_text", "exchange_vector", "context_vector"]
LEGS: Final[tuple[Leg, ...]] = ("distillation_text", "distillation_vector", "exchange_text", "exchange_vector",
                                "context_vector")

_SECONDS_PER_DAY: Final[float] = 86_400.0
# How many of the best memories a question about the present gets newest first: the memory
# block's default size (``RecallParams.limit``), so the block a model reads starts with the
# current value while the memories below it keep the score's order.
PRESENT_WINDOW: Final[int] = 5
# How many of the best memories the update reading reorders (step 6): a memory announcing a new
# value further down is not moved above the answer the score found (docs/RECALL.md).
UPDATE_WINDOW: Final[int] = 3


@dataclass(frozen=True)
class RecallParams:
    """The knobs of one recall: the request's threshold and limit, and the configured scoring."""

    threshold: float = 0.7
    limit: int = 5
    half_life_days: float = 30.0
    decay_enabled: bool = True
    core_multiplier: float = DEFAULT_CORE_MULTIPLIER
    relevance_exponent: float = 30.0
    superseded_factor: float = 0.5
    # How many rows each leg proposes; the union is what relevance is computed for.
    leg_size: int = 50
    # Search each exchange with its neighbours in the conversation: by words (sql/006) and by
    # meaning (sql/008, the context-vector leg and signal).
    exchange_context: bool = True
    # False: no gate (every candidate is ranked); for ablations and `--no-gate` diagnostics.
    gate: bool = True
    # A question about the present gets its first PRESENT_WINDOW memories newest first (step 5).
    present_newest_first: bool = True
    # A memory announcing a new value moves ahead of older ones near the top (step 6).
    updates_first: bool = True
    # Exchanges no active distillation holds are candidates too, as the user's own words (kind
    # "raw"); False: distillations only (the offline warmth judge, ablations).
    raw_exchanges: bool = True
    # A question that lists things to weigh together, or gathers over several topics
    # (``core.query_intent.query_parts``), is also recalled for each of them, and the rankings
    # interleaved (:func:`interleave`; YAK_RECALL_QUERY_PARTS, docs/RECALL.md).
    query_parts: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold must be between 0 and 1, got {self.threshold!r}")
        if self.limit < 0:
            raise ValueError(f"limit must be >= 0, got {self.limit}")
        if not self.relevance_exponent > 0 or math.isinf(self.relevance_exponent):
            raise ValueError(f"relevance_exponent must be a positive finite number, got {self.relevance_exponent!r}")
        if not 0.0 <= self.superseded_factor <= 1.0:
            raise ValueError(f"superseded_factor must be between 0 and 1, got {self.superseded_factor!r}")
        if self.leg_size < 1:
            raise ValueError(f"leg_size must be >= 1, got {self.leg_size}")


@dataclass(frozen=True)
class Candidate:
    """A memory some leg proposed, with its signals and what the score needs.

    ``kind`` "distilled": ``id`` is an active distillation's; "raw": ``id`` is the exchange's
    (``memories.id``), an exchange no active distillation holds, recalled as the user's words.
    """

    id: str
    tier: Tier
    warmth: float
    user_weight: float
    refreshed_at: datetime
    signals: RelevanceSignals
    ranks: Mapping[Leg, int] = field(default_factory=dict)
    superseded_by: str | None = None
    kind: MemoryKind = "distilled"
    # What the update reading reads (step 6): a distillation's text, a raw exchange's user side.
    words: str = ""

    def __post_init__(self) -> None:
        if self.kind not in MEMORY_KINDS:
            raise ValueError(f"unknown memory kind {self.kind!r}: use one of {', '.join(MEMORY_KINDS)}")
        if self.signals.raw != (self.kind == "raw"):
            raise ValueError(f"candidate {self.id}: its signals must say raw exactly when its kind is raw")
        if self.tier not in TIERS:
            raise ValueError(f"unknown tier {self.tier!r}: use one of {', '.join(TIERS)}")
        # A naive timestamp would make the age depend on the server's local time zone.
        if self.refreshed_at.tzinfo is None or self.refreshed_at.utcoffset() is None:
            raise ValueError(f"refreshed_at of {self.id} must be timezone-aware")


# exp() of more than this overflows a float (ln of the largest finite one is 709.78).
_LOG_LARGEST_FLOAT: Final[float] = math.log(sys.float_info.max)


@dataclass(frozen=True)
class RankedMemory:
    """A recalled memory with its score and every factor of it (the ``explain`` breakdown).

    ``kind`` says what ``id`` names (:class:`Candidate`): a distillation, or a raw exchange.
    """

    id: str
    tier: Tier
    warmth: float
    user_weight: float
    refreshed_at: datetime
    relevance: float
    standing: float
    answerability: float
    decay: float
    gravity: float
    superseded_by: str | None
    # What recall orders by, as its natural logarithm: ln(odds(standing)^e × decay × (1 + warmth) ×
    # gravity × f_superseded), summed from the factors' logarithms. The product itself spans
    # hundreds of orders of magnitude (1e29 and 1e-5 in one recall; past 1e308 with a steep model
    # or a large exponent, where computing it as a product raised OverflowError), so the order is
    # kept on this scale and :attr:`rank_odds` is only its display.
    log_rank_odds: float
    features: Mapping[str, float]
    ranks: Mapping[Leg, int]
    # The same order on the relevance scale, in [0, 1] (:func:`readable_score`): what every
    # surface shows as "score".
    score: float = 0.0
    # True when this memory's place was set by recency (a question about the present, step 5).
    newest_first: bool = False
    kind: MemoryKind = "distilled"
    # True when this memory moved ahead of older ones because its words announce a new value (step 6).
    update_first: bool = False

    @property
    def rank_odds(self) -> float:
        """The product :attr:`log_rank_odds` is the logarithm of, capped at the largest finite float."""
        return math.exp(min(self.log_rank_odds, _LOG_LARGEST_FLOAT))

    @property
    def similarity(self) -> float:
        """The best raw cosine of the query to the memory or its exchange (for display)."""
        return max(self.features["cos_distillation"], self.features["cos_exchange"])

    def reasons(self, now: datetime) -> list[str]:
        """Why this memory ranked where it did, in plain words (``explain``'s ``why``)."""
        f = self.features
        why = ["what you said yourself (no distilled memory stands for it yet)" if self.kind == "raw"
               else "a distilled memory"]
        if f.get("raw_not_about_self", 0.0) > 0.0:
            why.append("it says nothing about you (no I, me or my), so it counts for less")
        closest = any(f.get(name, -1.0) >= 0.0 for name in ("gap_distillation", "gap_exchange", "gap_context"))
        why.append(f"{'the closest in meaning of all your memories' if closest else 'close in meaning'}"
                   f" (similarity {self.similarity:.2f})")
        # The exchange's share of the best lexical match, before it is scaled by the query's strength.
        strength = f.get("lexical_strength", 1.0)
        text = max(f.get("text_distillation", 0.0), f.get("text_exchange", 0.0) / strength if strength > 0 else 0.0)
        if text >= 1.0 - 1e-9:
            why.append("shares the most words with the question")
        elif text > 0.0:
            why.append("shares words with the question")
        if f.get("answer_kind", 0.0) > 0.0:
            why.append("it holds the kind of thing the question asks for (a date, a number or a name)")
        if f.get("present_change", 0.0) > 0.0:
            why.append("the question asks how things are now, and it says how they are now or that they changed")
        days = max((now - self.refreshed_at).total_seconds() / _SECONDS_PER_DAY, 0.0)
        said = "today" if days < 1 else "yesterday" if days < 2 else f"{days:.0f} days ago"
        why.append(f"said {said}" + (", so it counts for less" if self.decay < 0.9 else ""))
        if self.kind == "distilled":
            if self.warmth > 0.6:
                why.append("it helped in earlier answers")
            elif self.warmth < 0.4:
                why.append("it did not help in earlier answers")
            if self.user_weight > 1.0:
                why.append(f"pinned by you (weight {self.user_weight:g})")
            elif self.user_weight < 1.0:
                why.append(f"weighted down by you (weight {self.user_weight:g})")
            if self.tier != "medium":
                why.append("a core memory: counts double" if self.tier == "core" else "a passing detail: counts half")
        if self.superseded_by is not None:
            why.append("a newer memory replaced it")
        if self.newest_first:
            why.append("put first as the newest, since the question asks about now")
        if self.update_first:
            why.append("put ahead of older memories: it says the value changed")
        return why

    def explain(self, now: datetime | None = None) -> dict[str, object]:
        """The score breakdown as plain data: relevance and its legs, decay, warmth, gravity, and
        (given ``now``) the reasons in plain words."""
        return {
            "kind": self.kind,
            **({"why": self.reasons(now)} if now is not None else {}),
            "score": self.score,
            "rank_odds": self.rank_odds,
            "relevance": self.relevance,
            "standing": self.standing,
            "answerability": self.answerability,
            "legs": {"ranks": dict(self.ranks), "features": dict(self.features)},
            "decay": self.decay,
            "warmth_factor": 1.0 + self.warmth,
            "gravity": self.gravity,
            "superseded_by": self.superseded_by,
            "newest_first": self.newest_first,
            "update_first": self.update_first,
        }


def _ln(factor: float) -> float:
    """``ln`` of a non-negative score factor; −inf for 0 (a superseded factor of 0 ranks last)."""
    return math.log(factor) if factor > 0.0 else -math.inf


def readable_score(log_rank_odds: float, answerability: float, exponent: float) -> float:
    """The recall order's value on the relevance scale, in [0, 1]: ``answerability × sigmoid(ln(rank_odds) / e)``,
    from ``ln(rank_odds)`` (:attr:`RankedMemory.log_rank_odds`).

    With neutral priors (no decay, warmth 0, gravity 1) it is the relevance itself; decay,
    warmth and gravity move it as they move the order (the e-th root undoes the exponent), and
    within one query it orders memories exactly as ``rank_odds`` does.
    """
    if log_rank_odds == -math.inf:
        return 0.0
    if log_rank_odds == math.inf:
        return answerability
    return answerability * sigmoid(log_rank_odds / exponent)


def newest_first(ranked: list[RankedMemory], window: int = PRESENT_WINDOW) -> list[RankedMemory]:
    """The first ``window`` memories ordered by when they were refreshed, latest first; the rest as they were.

    Ties keep their order (the sort is stable), so equal times stay in score order.
    """
    head = sorted(ranked[:window], key=lambda m: m.refreshed_at, reverse=True)
    return [replace(m, newest_first=True) for m in head] + ranked[window:]


def updates_first(ranked: list[RankedMemory], announcing: set[str], window: int = UPDATE_WINDOW) -> list[RankedMemory]:
    """The first ``window`` memories with each one in ``announcing`` (ids of memories whose words
    announce a new value) moved just above the first memory ahead of it that is older and announces
    nothing; the rest as they were. Memories that both announce, or both do not, keep their order."""
    head: list[RankedMemory] = []
    for memory in ranked[:window]:
        if memory.id not in announcing:
            head.append(memory)
            continue
        older = next((i for i, m in enumerate(head)
                      if m.id not in announcing and m.refreshed_at < memory.refreshed_at), None)
        if older is None:
            head.append(memory)
        else:
            head.insert(older, replace(memory, update_first=True))
    return head + ranked[window:]


def current_before_superseded(ranked: list[RankedMemory]) -> list[RankedMemory]:
    """``ranked`` with every superseded memory moved just after the memory that replaced it, when
    that one is listed below it: an outdated fact never leads the one that replaced it (a chain
    of updates keeps its order, newest first). Everything else keeps its place."""
    position = {m.id: i for i, m in enumerate(ranked)}
    if not any(m.superseded_by in position and position[m.superseded_by] > i for i, m in enumerate(ranked)):
        return ranked
    result = [m for m in ranked if not (m.superseded_by in position and position[m.superseded_by] > position[m.id])]
    moved = [m for m in ranked if m not in result]
    # Place each moved memory after its replacement; one replaced by a moved one is placed after it
    # in a later pass.
    while moved:
        waiting = []
        for memory in moved:
            target = next((i for i, m in enumerate(result) if m.id == memory.superseded_by), None)
            if target is None:
                waiting.append(memory)
            else:
                result.insert(target + 1, memory)
        if len(waiting) == len(moved):  # a cycle of supersessions (not made by Yak): keep the score's order
            result += waiting
            break
        moved = waiting
    return result


def rank_memories(
    candidates: Iterable[Candidate], *, model: RelevanceModel, params: RecallParams, now: datetime,
    about_present: bool = False, about_past: bool = False,
) -> list[RankedMemory]:
    """The reference recall: relevance, tier gate, score, and the best ``params.limit`` (module docstring).

    ``about_present`` (``core.query_intent.asks_about_present`` of the query) puts the first
    :data:`PRESENT_WINDOW` of them newest first, unless ``params.present_newest_first`` is off.
    ``about_past`` (``core.query_intent.asks_about_past``) keeps the update reading (step 6) out.
    """
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be timezone-aware")
    # (ln score, relevance, candidate, features, standing, answerability, decay, gravity) of each candidate
    # that passes; only the best ``limit`` become RankedMemory objects (about 130 candidates a query
    # at 100,000 rows, 10 kept: 1.2 -> 0.9 ms of rank_memories per recall).
    scored: list[tuple[float, float, Candidate, Mapping[str, float], float, float, float, float]] = []
    # The answerability depends only on the best cosines, the same for every candidate of a query.
    answerabilities: dict[tuple[float, float | None, float | None], float] = {}
    for candidate in candidates:
        features = relevance_features(candidate.signals)
        # The logit once: the standing is its sigmoid, the score its multiple (below).
        logit = model.logit(features)
        standing = sigmoid(logit)
        signals = candidate.signals
        best = (signals.best_cos_distillation, signals.best_cos_exchange, signals.best_cos_context)
        if best not in answerabilities:
            answerabilities[best] = model.answerability(signals)
        answerability = answerabilities[best]
        if params.gate and not (answerability >= params.threshold - GATE_EPSILON and passes_tier_gate(
                standing, params.threshold, candidate.tier, params.core_multiplier)):
            continue
        relevance = standing * answerability
        age_days = (now - candidate.refreshed_at).total_seconds() / _SECONDS_PER_DAY
        log_decay = log_decay_factor(age_days, params.half_life_days, params.decay_enabled)
        weight = gravity(candidate.tier, candidate.user_weight)
        replaced = params.superseded_factor if candidate.superseded_by is not None else 1.0
        # The answerability is the same for every candidate of the query, so the order among them
        # is the standing's; on the odds scale a factor of it would not change the order anyway,
        # and leaving it out keeps the product from flattening near 1. Summed as logarithms: the
        # standing's log-odds is its logit, so no product can overflow and no odds are capped.
        score = (params.relevance_exponent * logit + log_decay + _ln(1.0 + candidate.warmth)
                 + _ln(weight) + _ln(replaced))
        decay = math.exp(log_decay)
        scored.append((score, relevance, candidate, features, standing, answerability, decay, weight))
    # Recall order: best score, then most relevant, then id, so ties are stable.
    scored.sort(key=lambda item: (-item[0], -item[1], item[2].id))
    ranked = [
        RankedMemory(
            id=c.id, tier=c.tier, warmth=c.warmth, user_weight=c.user_weight, refreshed_at=c.refreshed_at,
            relevance=relevance, standing=standing, answerability=answerability, decay=decay, gravity=weight,
            superseded_by=c.superseded_by, log_rank_odds=score, features=features, ranks=dict(c.ranks), kind=c.kind,
            score=readable_score(score, answerability, params.relevance_exponent))
        for score, relevance, c, features, standing, answerability, decay, weight in scored[:params.limit]
    ]
    ranked = newest_first(ranked) if about_present and params.present_newest_first else ranked
    if params.updates_first and not about_past:
        # Read only for the few memories it may move: a raw exchange's words can be long.
        top = {m.id for m in ranked[:UPDATE_WINDOW]}
        announcing = {c.id for _, _, c, *_ in scored[:params.limit] if c.id in top and announces_update(c.words)}
        ranked = updates_first(ranked, announcing) if announcing else ranked
    return current_before_superseded(ranked)


def interleave(rankings: Sequence[Sequence[RankedMemory]], limit: int) -> list[RankedMemory]:
    """One ranking from several (the whole question's first, then each of its parts'): their first
    memories, then their second ones, and so on, each memory once, up to ``limit``.

    A question that lists several things needs a memory about each: the whole question's
    similarity favours whichever thing dominates its wording, and each part's own ranking
    brings its best memory forward. Round by round, the whole question's memory leads."""
    merged: list[RankedMemory] = []
    seen: set[tuple[str, str]] = set()
    for depth in range(max((len(r) for r in rankings), default=0)):
        for ranking in rankings:
            if depth < len(ranking) and (key := (ranking[depth].kind, ranking[depth].id)) not in seen:
                seen.add(key)
                merged.append(ranking[depth])
                if len(merged) >= limit:
                    return merged
    return merged
