"""The block measures: what a prompt would get from each Yak method's ranking, and how good it is.

The *block* (``block``) is the first ``YAK_PROXY_RECALL_LIMIT`` recalled memories cut as
``build_context`` cuts them (``core.block_choice.choose_block``: the odds gap, superseded memories
left out unless the question asks about the past, the token budget), scored with
``eval.metrics.block_scores`` — precision, recall, size, estimated tokens and stale lead, overall
and per category — beside ``fixed_block``, the same first memories with no cut (the block before
the odds gap and the budget).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from yak_pipeline.core.block_choice import BlockChoice, BlockShape, block_shape, choose_block, line_tokens
from yak_pipeline.core.query_intent import asks_about_past
from yak_pipeline.core.recall import RankedMemory
from yak_pipeline.eval.collection import AskedQuestion
from yak_pipeline.eval.metrics import PROFILE_ABILITIES, block_scores, mean_or_none, profile_hit
from yak_pipeline.eval.ranking import hit_texts
from yak_pipeline.store.database import Database


@dataclass(frozen=True)
class BlockSpec:
    """How a prompt's block is made from what recall ranks: the first ``limit`` memories, cut by ``choice``."""

    limit: int
    choice: BlockChoice
    exponent: float


def _chosen_block(asked: AskedQuestion, ranked: Sequence[RankedMemory], items: Sequence[frozenset[str]],
                  texts: Sequence[str], spec: BlockSpec, *, cut: bool) -> tuple[list[frozenset[str]], int]:
    """The block's memories (each the turns it holds) and its estimated tokens; with ``cut`` False,
    the first memories as they come (the block before the odds gap and the budget). The tokens are
    each kept memory's whole line: a bound, since the block cuts a first line longer than the budget."""
    # A question that gathers gets up to the gather limit, no odds gap, newest first (the shape
    # services.recall.build_context cuts too; here by when each memory was last stated).
    shape = block_shape(asked.question.question, spec.limit, spec.choice) if cut else BlockShape(spec.limit, spec.choice)
    top = list(range(min(shape.limit, len(ranked))))
    tokens = [line_tokens(texts[i]) for i in top]
    if cut:
        history = asks_about_past(asked.question.question)
        chosen = choose_block([ranked[i].log_rank_odds for i in top], tokens, exponent=spec.exponent, choice=shape.choice,
                              superseded=None if history else [ranked[i].superseded_by is not None for i in top])
        top = [top[i] for i in chosen]
        if shape.newest_first:
            top = sorted(top, key=lambda i: ranked[i].refreshed_at, reverse=True)
    return [items[i] for i in top], sum(tokens[i] for i in top)


# One answerable question's block: its category, its ability (or None), the block's scores, its tokens.
BlockRow = tuple[int, str | None, dict[str, float | None], int]


def block_rows(db: Database, asked: AskedQuestion, ranked: Sequence[RankedMemory], items: Sequence[frozenset[str]],
               spec: BlockSpec) -> dict[str, BlockRow]:
    """One answerable question's rows for a Yak method's ranking: the cut block (``block``) and the
    first memories uncut (``fixed_block``), each scored against the evidence, with the profile part."""
    question = asked.question
    with db.connection() as conn:
        texts = hit_texts(conn, ranked[:max(spec.limit, spec.choice.gather_limit)])
    profile = asked.conversation.profile_turns
    rows: dict[str, BlockRow] = {}
    for name, cut in (("block", True), ("fixed_block", False)):
        chosen, tokens = _chosen_block(asked, ranked, items, texts, spec, cut=cut)
        scores = block_scores(chosen, question.evidence, question.superseded)
        scores["profile_hit"] = (profile_hit(chosen, profile, question.evidence)
                                 if question.ability in PROFILE_ABILITIES else None)
        scores["profile_tokens"] = float(asked.conversation.profile_tokens)
        rows[name] = (question.category, question.ability, scores, tokens)
    return rows


def block_report(rows: Sequence[BlockRow]) -> dict[str, Any]:
    """The block measures (``eval.metrics.block_scores`` and tokens) averaged overall, per category
    and (where the file names them) per ability."""
    groups: dict[str, list[tuple[dict[str, float | None], int]]] = {}
    abilities: dict[str, list[tuple[dict[str, float | None], int]]] = {}
    for category, ability, score, tokens in rows:
        groups.setdefault(str(category), []).append((score, tokens))
        if ability is not None:
            abilities.setdefault(ability, []).append((score, tokens))

    def summary(rows: list[tuple[dict[str, float | None], int]]) -> dict[str, Any]:
        def mean(key: str) -> float | None:
            return mean_or_none([s[key] for s, _ in rows if s[key] is not None])  # type: ignore[misc]
        return {"n": len(rows), "block_precision": mean("precision"), "block_recall": mean("recall"),
                "block_size": mean("size"), "stale_lead": mean("stale_lead"),
                "stale_lead_n": sum(1 for s, _ in rows if s["stale_lead"] is not None),
                "empty": mean_or_none([float(s["size"] == 0) for s, _ in rows]),
                "tokens": mean_or_none([float(t) for _, t in rows]),
                # The profile part (issue 39): sent with every block, apart from the recalled memories.
                "profile_hit": mean("profile_hit"),
                "profile_hit_n": sum(1 for s, _ in rows if s["profile_hit"] is not None),
                "profile_tokens": mean("profile_tokens"),
                "tokens_with_profile": mean_or_none([float(t) + (s["profile_tokens"] or 0.0) for s, t in rows])}

    overall = summary([(score, tokens) for _, _, score, tokens in rows])
    return {**overall, "by_category": {key: summary(groups[key]) for key in sorted(groups, key=int)},
            "by_ability": {key: summary(abilities[key]) for key in sorted(abilities)}}
