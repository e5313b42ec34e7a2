"""The merge stage's look-ahead: the next distillations' merges worked out ahead of their turn.

``merge_near_duplicates`` (services/consolidate.py) commits merges one distillation at a time,
each re-checked under locks; this module works out the next ones on the committed state so that
their consolidated texts go to the embedder together, in one call that runs on every core
(embeddings/local.py), instead of one single-text call per merge on one core.

Near-duplicates chain: the texts "I moved to Lisbon" said five times make four merges into the
same surviving distillation, each consolidating the survivor's text of the merge before. A
look-ahead that stopped at the first merge touching an earlier one's distillations covered one
or two merges. Here it goes on through a chain, reading the survivor's text as the earlier merge
will have left it (a speculation), and stops only where a merge involves a distillation an
earlier merge absorbs (what that merge finds instead is unknown until then). A speculation that
turns out wrong costs a wasted consolidation and vector, never a wrong merge: at its turn a
merge uses what was worked out here only if the same pair with the same texts comes out of the
neighbour search again (``Foresight.inputs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from yak_pipeline.core.dedup import NEAR_DUPLICATE_TOP_K, choose_merge_target, select_near_duplicates
from yak_pipeline.embeddings import Embedder, EmbeddingError
from yak_pipeline.llm.errors import LLMError
from yak_pipeline.llm.models import ConsolidationResult
from yak_pipeline.llm.provider import LLMProvider
from yak_pipeline.services.reports import StageReport
from yak_pipeline.store.conflicts import conflicting_ids
from yak_pipeline.store.consolidation_checks import MergeTarget, lock_merge_target, lock_unchecked
from yak_pipeline.store.database import Database
from yak_pipeline.store.distillations import nearest_active


@dataclass(frozen=True)
class MergePair:
    """A merge about to happen: which distillation is older and which newer, with their current text."""

    older: MergeTarget
    newer: MergeTarget

    def inputs(self) -> tuple[str, str, str, str]:
        """What the consolidation depends on: both ids and both texts."""
        return (str(self.older.id), self.older.content, str(self.newer.id), self.newer.content)


@dataclass
class Foresight:
    """A merge worked out ahead of its turn: the consolidation (or its error) and its embedding.

    Only ever used when, at the distillation's turn, under its lock, the same pair with the same
    texts comes out of the neighbour search again — so the outcome is what working it out at
    that moment would have given.
    """

    inputs: tuple[str, str, str, str]
    merged: ConsolidationResult | None = None
    error: LLMError | None = None
    vector: list[float] | None = None


def merge_pair(conn, distillation_id: str, row, *, lock: bool) -> tuple[bool, MergePair | None]:  # noqa: ANN001
    """The near-duplicate merge due for a distillation: ``(found, pair)``.

    ``found`` says whether there is a near-duplicate at all; ``pair`` is None when there is none
    or when the target is locked by another worker (``lock``) or no longer active.
    """
    owner, embedding, model = row.user_id, row.embedding, row.embedding_model
    neighbours = nearest_active(conn, user_id=owner, embedding=embedding, embedding_model=model,
                                limit=NEAR_DUPLICATE_TOP_K, exclude_id=distillation_id)
    near = select_near_duplicates(distillation_id, owner, neighbours, conflicting_ids(conn, distillation_id))
    target = choose_merge_target(near)
    if target is None:
        return False, None
    other = lock_merge_target(conn, target.id, lock=lock)
    if other is None:
        return True, None
    mine = MergeTarget(distillation_id, row.content, row.created_at, row.refreshed_at)
    older, newer = sorted([mine, other], key=lambda r: (r.created_at, str(r.id)))
    return True, MergePair(older=older, newer=newer)


@dataclass
class _Planned:
    """A merge of the look-ahead, and the earlier merges of it whose survivor's text it reads."""

    pair: MergePair
    # Side id → the distillation whose merge leaves that side's text (a chain link).
    reads: dict[str, str] = field(default_factory=dict)


def _plan(db: Database, ids: Sequence[str]) -> tuple[int, dict[str, _Planned]]:
    """The merges of the next distillations as the committed state shows them; how many ids it covered.

    Reads only, in one short transaction. A merge's survivor (the older side) goes on with the
    merged text, so a later merge into it is planned as a link of a chain; a later merge involving
    a distillation an earlier one absorbs ends the look-ahead there (it will find another pair).
    A distillation an earlier merge involves is covered without a plan: that merge checks it.
    """
    planned: dict[str, _Planned] = {}
    involved: set[str] = set()
    absorbed: set[str] = set()
    survivor_of: dict[str, str] = {}  # a survivor's id → the distillation whose merge last rewrote it
    covered = 0
    with db.connection() as conn:
        for distillation_id in ids:
            if distillation_id in involved:
                covered += 1
                continue
            row = lock_unchecked(conn, distillation_id, "dedup_checked_at", lock=False)
            pair = None if row is None else merge_pair(conn, distillation_id, row, lock=False)[1]
            if pair is not None:
                older, newer = str(pair.older.id), str(pair.newer.id)
                if {older, newer} & absorbed:
                    break
                planned[distillation_id] = _Planned(pair, {side: survivor_of[side] for side in (older, newer)
                                                           if side in survivor_of})
                involved |= {older, newer}
                absorbed.add(newer)
                survivor_of.pop(newer, None)
                survivor_of[older] = distillation_id
            covered += 1
    return max(covered, 1), planned


def _layers(planned: dict[str, _Planned]) -> list[list[str]]:
    """The planned merges in rounds: each round's consolidations read only earlier rounds' results."""
    depth: dict[str, int] = {}
    for distillation_id, plan in planned.items():  # in order, so every link it reads has its depth
        depth[distillation_id] = 1 + max((depth[link] for link in plan.reads.values()), default=-1)
    rounds: list[list[str]] = [[] for _ in range(1 + max(depth.values(), default=-1))]
    for distillation_id, level in depth.items():
        rounds[level].append(distillation_id)
    return rounds


def _consolidate_all(llm: LLMProvider, planned: dict[str, _Planned], concurrency: int) -> dict[str, Foresight]:
    """Each planned merge consolidated (its texts read through its chain links), round by round.

    A merge whose link has no consolidated text (its call failed, or a link of it did) is left out:
    its turn works it out on what is committed by then.
    """
    foresights: dict[str, Foresight] = {}

    def consolidate(distillation_id: str) -> Foresight | None:
        plan = planned[distillation_id]
        texts = {}
        for side in (plan.pair.older, plan.pair.newer):
            link = plan.reads.get(str(side.id))
            if link is None:
                texts[str(side.id)] = side.content
            else:
                merged = foresights[link].merged if link in foresights else None
                if merged is None:
                    return None
                texts[str(side.id)] = merged.content
        older, newer = texts[str(plan.pair.older.id)], texts[str(plan.pair.newer.id)]
        foresight = Foresight(inputs=(str(plan.pair.older.id), older, str(plan.pair.newer.id), newer))
        try:
            foresight.merged = llm.consolidate(older, newer)
        except LLMError as exc:
            foresight.error = exc
        return foresight

    for ids in _layers(planned):
        if concurrency > 1 and len(ids) > 1:
            with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="yak-merge") as pool:
                results = list(pool.map(consolidate, ids))
        else:
            results = [consolidate(distillation_id) for distillation_id in ids]
        foresights.update({i: f for i, f in zip(ids, results) if f is not None})
    return foresights


def look_ahead(db: Database, llm: LLMProvider, embedder: Embedder, ids: list[str], report: StageReport, *,
               concurrency: int) -> tuple[int, dict[str, Foresight]]:
    """Work out the merges of the next distillations, their consolidated texts embedded in one call.

    Returns how many ids it covered (at least one) and the merges worked out, by distillation id.
    Nothing is locked or written here: each merge is re-checked under locks at its turn.
    """
    covered, planned = _plan(db, ids)
    # The LLM calls hold no connection.
    foresights = _consolidate_all(llm, planned, concurrency)
    merged = [(f, f.merged) for f in foresights.values() if f.merged is not None]
    for _, result in merged:
        report.record_call(result.stats)
    if merged:
        vectors: Sequence[list[float] | None]
        try:
            vectors = embedder.embed_documents([result.content for _, result in merged])
        except EmbeddingError:
            vectors = [None] * len(merged)  # each is embedded again at its turn, failing there if it must
        for (foresight, _), vector in zip(merged, vectors):
            foresight.vector = vector
    return covered, foresights
