"""Calibrated relevance: how well a memory answers a query, on one [0, 1] scale (DESIGN §4, docs/RECALL.md).

Raw cosine does not mean the same thing from one embedder to the next (all-MiniLM-L6-v2 scores
a question and the memory that answers it 0.3–0.55), and BM25 has no fixed scale at all. The
recall gate ``t`` needs a number that does: so each candidate's signals from the recall legs
are turned into *features* with a fixed meaning and combined by a small logistic model,

    relevance = sigmoid(bias + Σ weight_f × feature_f) × answerability
    answerability = sigmoid(a_bias + Σ a_weight_g × best_g)

fitted on labelled dev data (``yak eval calibrate``). The first factor, the *standing*, says how
a memory stands among the user's memories for the query; it ranks well but cannot say that
*nothing* answers (the best of a poor lot stands out too). The second, the *answerability*, the
same for every candidate of a query, says whether the user's memories answer the query at all,
from how close the best of them comes (``best_*``); it is fitted on answerable questions against
never-said ones and against questions asked of another person's memories (which cannot answer
"my" question). Each factor's scale is placed so that the default threshold 0.7 keeps a fixed
share of the dev files' true cases: 99 % of true evidence has standing ≥ 0.7, 99.5 % of answerable
questions have answerability ≥ 0.7 in the fit (99 % out of fold; ``eval.calibrate``). ``core.recall``
gates each factor.
The parameters belong to one embedding model (they are fitted on its cosines) and carry a
version; recall refuses an embedder they were not fitted for.

Features (all pure functions of :class:`RelevanceSignals`):

- ``cos_distillation``, ``cos_exchange`` — cosine similarity of the query to the distillation
  and to the raw exchange it came from (the exchange keeps what the distillation dropped);
- ``cos_context`` — cosine similarity to the exchange read together with its neighbours in the
  conversation (sql/008): "In the bathroom." answers "where do I develop my photos?" only next
  to the question it replied to;
- ``gap_distillation``, ``gap_exchange``, ``gap_context`` — how far that cosine is below the best of the user's
  memories for this query (0 for the best): a memory that stands out among the user's own is
  likelier to answer than one that merely shares the topic of everything the user says;
- ``text_distillation``, ``text_exchange`` — BM25 relative to the best BM25 of the query in
  that leg (1 for the best lexical match, 0 when the query's words are absent); the exchange's
  times ``lexical_strength`` (below). Their weights
  are fitted with a lower bound of 0: sharing the query's words is evidence *for* a memory,
  never against it (a data set whose questions avoid the memory's words must not teach the
  opposite).
- ``lexical_strength`` — how much the query's words say at all, the same for every candidate of
  a query: ``sigmoid(best BM25 of the exchange leg − LEXICAL_MIDPOINT)``. When a question shares
  only a common word or two with anything the user said (a paraphrase: "What's my mother's first
  name?" against "Mum is called Ingrid"), the best lexical match is no evidence, and
  ``text_exchange`` is scaled by this strength, so shared words count only when they say much;
- ``raw_exchange`` — 1 for a raw exchange that no active distillation holds (the user's own
  words, recalled as said), 0 for a distillation. Such a candidate has no distillation: its
  ``cos_distillation`` is its exchange's cosine, and the fit learns how much a distillation's
  refinement is worth against the words themselves.
- ``raw_not_about_self`` — 1 for such a raw exchange whose user side has no first-person word
  (:func:`speaks_of_self`): "Can you make a moving checklist?" or "Wow, nice!" says nothing about
  the person, "my niece Greta is three" does. A distillation is always about its user: 0.
- ``answer_kind`` — 1 when the query asks for a date, a number or a name and the memory's words
  hold one (``core.answer_kinds``: "When did I move?" and "…moved in March"), else 0.
- ``present_change`` — 1 when the query asks about the present ("How do I commute currently?",
  ``core.query_intent``) and the memory is a distillation whose words tell how things stand now
  or that they changed ("User bought a Vespa, so now they scoot to school";
  ``core.updates.tells_of_change``), else 0: the current statement, not the one it replaced.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

FEATURES: Final[tuple[str, ...]] = (
    "cos_distillation",
    "cos_exchange",
    "cos_context",
    "gap_distillation",
    "gap_exchange",
    "gap_context",
    "text_distillation",
    "text_exchange",
    "raw_exchange",
    "lexical_strength",
    "raw_not_about_self",
    "answer_kind",
    "present_change",
)
# The best BM25 of a query's exchange leg at which its words count half (``lexical_strength``):
# with PostgreSQL's english stemming and Okapi BM25 over a person's exchanges, a match of one or two
# common words scores 2-4, a question that names what it asks about 7-15. Chosen by nested
# cross-validation on the dev files (each fold picked 5 from 3, 5, 7, 9; docs/RECALL.md).
LEXICAL_MIDPOINT: Final[float] = 5.0
# Lexical features may only add evidence (see the module docstring); the fit respects this.
NON_NEGATIVE_FEATURES: Final[frozenset[str]] = frozenset({"text_distillation", "text_exchange"})
# What says whether the query is answerable from the user's memories at all: how close the
# best of them comes. Their weights may only be positive (closer is never worse).
ANSWERABLE_FEATURES: Final[tuple[str, ...]] = ("best_cos_distillation", "best_cos_exchange", "best_cos_context")


@dataclass(frozen=True)
class RelevanceSignals:
    """What the recall legs measured for one candidate memory and one query.

    ``cos_*`` are cosine similarities (the exchange's is None until it has a vector of the
    active model; ``cos_context``, of the exchange read with its neighbours in the conversation
    (sql/008), is None until that vector exists, and when recalling ``as_of`` a past moment,
    since a context can hold later words); ``bm25_*`` are BM25 scores (0 when the leg did not
    match it). ``best_*`` are the best values any of the user's memories reached for the same
    query in that leg.
    """

    cos_distillation: float
    cos_exchange: float | None
    bm25_distillation: float
    bm25_exchange: float
    best_cos_distillation: float
    best_cos_exchange: float | None
    best_bm25_distillation: float
    best_bm25_exchange: float
    cos_context: float | None = None
    best_cos_context: float | None = None
    # A raw exchange no active distillation holds (``core.recall.Candidate.kind == "raw"``).
    raw: bool = False
    # Whether a raw exchange's user side speaks of the user (:func:`speaks_of_self`); a distillation always does.
    about_self: bool = True
    # Whether the query asks for a kind of thing (a date, a number, a name) that the memory's words
    # hold (``core.answer_kinds``).
    answer_kind: bool = False
    # Whether the query asks about the present and the memory, a distillation, tells how things
    # stand now or that they changed (``core.updates.tells_of_change``).
    present_change: bool = False


def _ratio(value: float, best: float) -> float:
    return max(0.0, min(1.0, value / best)) if best > 0 else 0.0


def relevance_features(signals: RelevanceSignals) -> dict[str, float]:
    """The model's inputs for one candidate (names as in :data:`FEATURES`)."""
    cos_x = signals.cos_exchange if signals.cos_exchange is not None else signals.cos_distillation
    best_x = signals.best_cos_exchange if signals.best_cos_exchange is not None else signals.best_cos_distillation
    # A missing context vector reads as the exchange alone: the best stand-in, not a penalty.
    cos_c = signals.cos_context if signals.cos_context is not None else cos_x
    best_c = signals.best_cos_context if signals.best_cos_context is not None else best_x
    strength = sigmoid(signals.best_bm25_exchange - LEXICAL_MIDPOINT)
    return {
        "cos_distillation": signals.cos_distillation,
        "cos_exchange": cos_x,
        "cos_context": cos_c,
        # The best is taken over the same rows, so a gap is <= 0; max() guards float noise.
        "gap_distillation": min(0.0, signals.cos_distillation - signals.best_cos_distillation),
        "gap_exchange": min(0.0, cos_x - max(best_x, cos_x)),
        "gap_context": min(0.0, cos_c - max(best_c, cos_c)),
        "text_distillation": _ratio(signals.bm25_distillation, signals.best_bm25_distillation),
        "text_exchange": _ratio(signals.bm25_exchange, signals.best_bm25_exchange) * strength,
        "raw_exchange": 1.0 if signals.raw else 0.0,
        "lexical_strength": strength,
        "raw_not_about_self": 1.0 if signals.raw and not signals.about_self else 0.0,
        "answer_kind": 1.0 if signals.answer_kind else 0.0,
        "present_change": 1.0 if signals.present_change else 0.0,
    }


# A word by which a person speaks of themselves (English: the language of the rules distiller too).
_FIRST_PERSON: Final = re.compile(r"\b(?:i|i'm|im|i've|i'd|i'll|my|me|mine|myself)\b", re.IGNORECASE)


def speaks_of_self(text: str) -> bool:
    """True when ``text`` (what the user said) has a first-person word: "I", "my", "me", "mine"…"""
    return _FIRST_PERSON.search(text) is not None


def answerable_features(signals: RelevanceSignals) -> dict[str, float]:
    """The query-level inputs (names as in :data:`ANSWERABLE_FEATURES`): the best cosines of the user's memories."""
    best_x = signals.best_cos_exchange if signals.best_cos_exchange is not None else signals.best_cos_distillation
    best_c = signals.best_cos_context if signals.best_cos_context is not None else best_x
    return {"best_cos_distillation": signals.best_cos_distillation, "best_cos_exchange": best_x,
            "best_cos_context": best_c}


def sigmoid(x: float) -> float:
    """``1 / (1 + e^-x)``, computed without overflow for either sign of ``x``."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


@dataclass(frozen=True)
class RelevanceModel:
    """A fitted relevance model for one embedding model (see the module docstring)."""

    embedding_model: str
    version: str
    bias: float
    weights: Mapping[str, float]
    # The query-level factor (module docstring); no weights: every query counts as answerable.
    answerable_bias: float = 0.0
    answerable_weights: Mapping[str, float] = field(default_factory=dict)
    # How far the operating point moved ``bias`` from the equal-weights fit (eval.calibrate):
    # recall's gate wants the lenient scale, a usefulness judgement the unshifted one.
    standing_shift: float = 0.0
    # Where the parameters came from (data files, counts, measures): shown, never used.
    fitted_on: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = (set(self.weights) - set(FEATURES)) | (set(self.answerable_weights) - set(ANSWERABLE_FEATURES))
        if unknown:
            raise ValueError(f"relevance model {self.version}: unknown features {sorted(unknown)}")
        for name in NON_NEGATIVE_FEATURES:
            if self.weights.get(name, 0.0) < 0:
                raise ValueError(f"relevance model {self.version}: weight of {name} must be >= 0")
        if any(v < 0 for v in self.answerable_weights.values()):
            raise ValueError(f"relevance model {self.version}: answerable weights must be >= 0")
        values = [self.bias, self.answerable_bias, self.standing_shift, *self.weights.values(),
                  *self.answerable_weights.values()]
        if not all(math.isfinite(v) for v in values):
            raise ValueError(f"relevance model {self.version}: parameters must be finite numbers")

    def logit(self, features: Mapping[str, float]) -> float:
        """``bias + Σ weight × feature`` (features the model does not weigh are ignored)."""
        return self.bias + sum(w * features[name] for name, w in self.weights.items())

    def answerability(self, signals: RelevanceSignals) -> float:
        """How likely the user's memories answer the query at all, from how close the best comes (1 without weights)."""
        if not self.answerable_weights:
            return 1.0
        features = answerable_features(signals)
        return sigmoid(self.answerable_bias + sum(w * features[n] for n, w in self.answerable_weights.items()))

    def standing(self, signals: RelevanceSignals) -> float:
        """How likely this memory is the answer, if the user's memories hold one (the first factor)."""
        return sigmoid(self.logit(relevance_features(signals)))

    def relevance(self, signals: RelevanceSignals) -> float:
        """The calibrated relevance in [0, 1] of one candidate: its standing × the query's answerability."""
        return self.standing(signals) * self.answerability(signals)

    def usefulness(self, signals: RelevanceSignals) -> float:
        """The relevance on the equal-weights scale (the standing's operating point undone).

        Recall's operating point is lenient on purpose (it keeps 99 in 100 true answers and lets
        the order decide); judging whether a memory was *used* (warmth) needs the even-odds
        probability, on which a loosely related memory scores low.
        """
        return sigmoid(self.logit(relevance_features(signals)) - self.standing_shift) * self.answerability(signals)

    def to_dict(self) -> dict[str, object]:
        """The JSON form (``recall_models/*.json``)."""
        return {"embedding_model": self.embedding_model, "version": self.version, "bias": self.bias,
                "weights": dict(self.weights), "answerable_bias": self.answerable_bias,
                "answerable_weights": dict(self.answerable_weights), "standing_shift": self.standing_shift,
                "fitted_on": dict(self.fitted_on)}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> RelevanceModel:
        """Parse the JSON form; a missing or malformed field is a ValueError naming it."""
        try:
            weights = data["weights"]
            if not isinstance(weights, Mapping):
                raise ValueError("'weights' must be an object")
            answerable = data.get("answerable_weights") or {}
            if not isinstance(answerable, Mapping):
                raise ValueError("'answerable_weights' must be an object")
            fitted_on = data.get("fitted_on") or {}
            if not isinstance(fitted_on, Mapping):
                raise ValueError("'fitted_on' must be an object")
            return cls(embedding_model=str(data["embedding_model"]), version=str(data["version"]),
                       bias=float(data["bias"]),  # type: ignore[arg-type]
                       weights={str(k): float(v) for k, v in weights.items()},
                       answerable_bias=float(data.get("answerable_bias", 0.0)),  # type: ignore[arg-type]
                       answerable_weights={str(k): float(v) for k, v in answerable.items()},
                       standing_shift=float(data.get("standing_shift", 0.0)),  # type: ignore[arg-type]
                       fitted_on=dict(fitted_on))
        except KeyError as exc:
            raise ValueError(f"relevance model: missing field {exc.args[0]!r}") from None
        except (TypeError, ValueError) as exc:
            raise ValueError(f"relevance model: {exc}") from None
