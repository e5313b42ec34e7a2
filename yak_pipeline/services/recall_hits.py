"""What a recalled memory shows: its text, its date and why it ranked (:class:`RecallHit`).

``store.recall`` ranks ids; :func:`recall_hits` reads what each ranked memory says (a
distillation's text, or the user's own words of a raw exchange) and words its reasons.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime

import psycopg

from yak_pipeline.core.exchanges import users_words
from yak_pipeline.core.recall import RankedMemory
from yak_pipeline.llm.rules.words import STOP_WORDS, words_of
from yak_pipeline.store.recall_hit_rows import raw_hit_rows, recall_hit_rows


@dataclass(frozen=True)
class RecallHit:
    """One recalled memory: what it says, its date, and its score with every factor.

    A distilled hit's ``content`` is the distillation; a raw hit's (``kind == "raw"``, an exchange
    no active distillation holds) is what the user said, and ``reply`` the assistant's side of
    that exchange, context only, never a fact about the user. A raw hit has no ``confidence``
    (no LLM wrote it).
    """

    ranked: RankedMemory
    memory_id: str
    content: str
    confidence: float | None
    occurred_at: datetime
    in_conflict: bool
    # The LLM's judgement of this memory for the query (``services.recall_judge``), when one judged it.
    judgement: float | None = None
    reply: str | None = None
    # What kind of thing a distilled hit says (core.memory_types) and an event's day; a raw hit, the
    # user's own words, has no type.
    memory_type: str | None = None
    event_on: date | None = None
    # Why it ranked, in plain words (``RankedMemory.reasons`` and the words it shares with the query).
    why: tuple[str, ...] = ()

    # The ranking's own values, read through (one copy of each).
    id = property(lambda self: self.ranked.id)
    kind = property(lambda self: self.ranked.kind)
    tier = property(lambda self: self.ranked.tier)
    warmth = property(lambda self: self.ranked.warmth)
    similarity = property(lambda self: self.ranked.similarity)
    relevance = property(lambda self: self.ranked.relevance)
    score = property(lambda self: self.ranked.score)
    rank_odds = property(lambda self: self.ranked.rank_odds)
    log_rank_odds = property(lambda self: self.ranked.log_rank_odds)
    superseded_by = property(lambda self: self.ranked.superseded_by)

    @property
    def is_core(self) -> bool:
        """Core memories get the wider gate and double gravity."""
        return self.tier == "core"

    def explain(self) -> dict[str, object]:
        """The score breakdown (relevance and its legs, decay, warmth, gravity, supersession), and
        the LLM's judgement when one judged the memory."""
        breakdown = {"why": list(self.why), **self.ranked.explain()}
        if self.judgement is not None:
            breakdown["llm_judgement"] = self.judgement
        return breakdown


def shared_words(query: str, text: str) -> list[str]:
    """The query's content words that ``text`` also has (case aside), in the query's order."""
    have = set(words_of(text))
    return list(dict.fromkeys(w for w in words_of(query) if w in have and w not in STOP_WORDS and len(w) > 1))


def _why(ranked: RankedMemory, query: str, content: str, now: datetime) -> tuple[str, ...]:
    """Why ``ranked`` ranked, in plain words: its reasons, then the words it shares with ``query``."""
    reasons = ranked.reasons(now)
    matched = shared_words(query, content)
    if matched:
        reasons.append("matched words: " + ", ".join(matched[:8]))
    return tuple(reasons)


def recall_hits(conn: psycopg.Connection, ranked: Sequence[RankedMemory], *, query: str = "",
                now: datetime | None = None) -> list[RecallHit]:
    """The ranked memories with what each shows (a row forgotten meanwhile is left out), in order;
    with ``now``, each with its reasons in plain words (words shared with ``query`` among them)."""
    distilled = recall_hit_rows(conn, [r.id for r in ranked if r.kind == "distilled"])
    raw = raw_hit_rows(conn, [r.id for r in ranked if r.kind == "raw"])
    hits = []
    for r in ranked:
        if r.kind == "raw" and r.id in raw:
            said, reply = users_words(raw[r.id].content)
            hits.append(RecallHit(ranked=r, memory_id=r.id, content=said, confidence=None,
                                  occurred_at=raw[r.id].occurred_at, in_conflict=False, reply=reply,
                                  why=_why(r, query, said, now) if now is not None else ()))
        elif r.kind == "distilled" and r.id in distilled:
            row = distilled[r.id]
            hits.append(RecallHit(ranked=r, memory_id=str(row.memory_id), content=row.content,
                                  confidence=row.confidence, occurred_at=row.occurred_at,
                                  in_conflict=bool(row.in_conflict), memory_type=row.memory_type,
                                  event_on=row.event_on, why=_why(r, query, row.content, now) if now is not None else ()))
    return hits
