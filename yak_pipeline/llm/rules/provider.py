"""The offline provider itself: the four LLM methods, each a shell over the rules of its sibling modules."""

from __future__ import annotations

import time
from functools import lru_cache
from typing import Final

from yak_pipeline.core.exchanges import users_words
from yak_pipeline.core.memory_types import memory_type_of
from yak_pipeline.llm.models import (
    MAX_SENTENCES,
    ConsolidationResult,
    DistillationResult,
    LLMCallStats,
    ScoreResult,
)
from yak_pipeline.llm.rules.claims import (
    Claim,
    SentenceReading,
    claims_of,
    read_sentence,
    readings_conflict,
    same_value_in,
)
from yak_pipeline.llm.rules.conflicts import claims_conflict, clauses_of, conflict_claims
from yak_pipeline.llm.rules.distilling import (
    DIRECT_CONFIDENCE,
    HEDGED_CONFIDENCE,
    QUOTE_CONFIDENCE,
    SUMMARY_CONFIDENCE,
    TIER_ORDER,
    summarise,
    tier_of,
    valid_text,
)
from yak_pipeline.llm.rules.english import Statement, finish, third_person_statement, user_part
from yak_pipeline.llm.rules.words import TRAILING_PUNCT, content_words, normalised, sentences_of

# The offline provider's name: shown as the evaluator, and how callers tell it from a real LLM.
RULES_PROVIDER_NAME: Final = "rules"


@lru_cache(maxsize=4096)
def _conflict_reading(text: str) -> tuple[tuple[Claim, ...], tuple[SentenceReading, ...]]:
    """What :meth:`RulesProvider.conflict_score` reads of one text: its claims and its clauses, read
    once however many neighbours it is scored against (a run scores each new memory against up to
    five, and each is a neighbour of others: bench/ingest_throughput.py's conflict stage)."""
    clauses = (clause for sentence in sentences_of(text) for clause in clauses_of(sentence))
    return tuple(conflict_claims(text)), tuple(read_sentence(clause) for clause in clauses)


class RulesProvider:
    """Deterministic, offline :class:`~yak_pipeline.llm.provider.LLMProvider` stand-in (see the package docstring, yak_pipeline.llm.rules).

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
        """Third-person statements from the user's first-person sentences, typed by ``core.memory_types``
        (see the package docstring, yak_pipeline.llm.rules)."""
        started = time.perf_counter()
        if not exchange.strip():
            raise ValueError("cannot distil an empty exchange")
        user_text = user_part(exchange)
        if not user_text:
            content = "User sent an empty message."
            return DistillationResult(content=content, confidence=SUMMARY_CONFIDENCE, tier="low", stats=self._stats(started))
        statements: list[Statement] = []
        seen: set[str] = set()
        for sentence in sentences_of(user_text):
            statement = third_person_statement(sentence)
            if statement is None or normalised(statement.text) in seen:
                continue
            seen.add(normalised(statement.text))
            statements.append(statement)
        if statements:
            # Keep the four most important statements, then restore the user's order.
            ranked = sorted(
                range(len(statements)),
                key=lambda i: (TIER_ORDER[tier_of([statements[i].original, statements[i].text])], i),
            )
            kept = [statements[i] for i in sorted(ranked[:MAX_SENTENCES])]
            content = valid_text([s.text for s in kept], user_text)
            confidence = HEDGED_CONFIDENCE if any(s.hedged for s in kept) else DIRECT_CONFIDENCE
            tier = tier_of([s.original for s in kept] + [s.text for s in kept])
        else:
            summary, informative = summarise(user_text)
            content = valid_text([summary], user_text)
            # A faithful quote of what the user reported is worth recalling, but it is not distilled:
            # the middle band of the gate (active, needs_review) says exactly that.
            confidence = QUOTE_CONFIDENCE if informative else SUMMARY_CONFIDENCE
            tier = tier_of([user_text])
        # The type is the offline classifier's, on the user's words (as sql/017 typed existing rows);
        # the text above does not depend on it.
        return DistillationResult(content=content, confidence=confidence, tier=tier, stats=self._stats(started),
                                  memory_type=memory_type_of(users_words(exchange)[0]))

    def consolidate(self, older: str, newer: str) -> ConsolidationResult:
        """Newer's sentences, then older's that are new and not superseded, capped at 4."""
        started = time.perf_counter()
        newer_sentences = [finish(s) for s in sentences_of(newer) if TRAILING_PUNCT.sub("", s)]
        older_sentences = [finish(s) for s in sentences_of(older) if TRAILING_PUNCT.sub("", s)]
        if not newer.strip() and not older.strip():
            raise ValueError("cannot consolidate two empty texts")
        merged = list(newer_sentences)
        seen = {normalised(s) for s in merged}
        newer_claims = claims_of(newer)
        newer_keys = {(c.subject, c.predicate) for c in newer_claims if c.predicate != "is_a"}
        for sentence in older_sentences:
            if len(merged) >= MAX_SENTENCES:
                break
            if normalised(sentence) in seen:
                continue
            # The newer memory wins: "User lives in Paris" supersedes an older "User lives in Berlin".
            # An older sentence that only repeats the same value is dropped when it adds no words.
            claims = claims_of(sentence)
            if any((c.subject, c.predicate) in newer_keys and not same_value_in(c, newer_claims) for c in claims):
                continue
            if content_words(sentence) <= content_words(" ".join(merged)):
                continue
            merged.append(sentence)
            seen.add(normalised(sentence))
        content = valid_text(merged[:MAX_SENTENCES], newer if newer.strip() else older)
        return ConsolidationResult(content=content, stats=self._stats(started))

    def conflict_score(self, a: str, b: str) -> ScoreResult:
        """Contradiction heuristic over predicates and negation (see the package docstring, yak_pipeline.llm.rules); symmetric."""
        started = time.perf_counter()
        claims_a, clauses_a = _conflict_reading(a)
        claims_b, clauses_b = _conflict_reading(b)
        score = max((claims_conflict(x, y) for x in claims_a for y in claims_b), default=0.0)
        # Then the word-overlap check, clause by clause: "User lives in Lisbon and does not own a car"
        # negates nothing of "User lives in Lisbon".
        for clause_a in clauses_a:
            for clause_b in clauses_b:
                score = max(score, readings_conflict(clause_a, clause_b))
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
