"""``/api/distillations``: recall search, list, show with versions, manual version, merge, re-embed,
pin, tier and type."""

from __future__ import annotations

import time
from typing import Annotated, Literal
from uuid import UUID

from fastapi import APIRouter, HTTPException, Query, status

from yak_pipeline.api.dependencies import Caller, Services
from yak_pipeline.api.schemas.base import UserId, rows_to
from yak_pipeline.api.schemas.distillations import (
    DistillationDetail,
    DistillationOut,
    DistillationPage,
    ManualVersion,
    MergeRequest,
    TierUpdate,
    TypeUpdate,
    VersionOut,
    WeightUpdate,
)
from yak_pipeline.api.schemas.recall import SearchHit, SearchRequest
from yak_pipeline.services.curation import (
    distillation_with_versions,
    list_distillations,
    merge_distillations,
    reembed_distillation,
    set_memory_type,
    write_manual_version,
)
from yak_pipeline.services.curation import (
    set_tier as set_distillation_tier,
)
from yak_pipeline.services.curation import (
    set_weight as set_distillation_weight,
)
from yak_pipeline.services.memories import user_has_memories
from yak_pipeline.services.recall import search_memories
from yak_pipeline.store.database import Database

router = APIRouter(prefix="/api/distillations", tags=["distillations"])

_MERGE_REFUSALS = {"not_found": status.HTTP_404_NOT_FOUND, "different_users": status.HTTP_422_UNPROCESSABLE_CONTENT,
                   "same_id": status.HTTP_422_UNPROCESSABLE_CONTENT, "not_mergeable": status.HTTP_409_CONFLICT}


def _detail(db: Database, distillation_id: UUID, user_id: str | None) -> DistillationDetail:
    found = distillation_with_versions(db, distillation_id, user_id=user_id)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"distillation {distillation_id} not found")
    row, versions = found
    return DistillationDetail.model_validate({**row, "versions": rows_to(VersionOut, versions)})


@router.post("/search", response_model=list[SearchHit],
             responses={404: {"description": "The user has no memories at all (a mistyped user id?)."}})
def search(body: SearchRequest, caller: Caller, services: Services) -> list[SearchHit]:
    """The user's best distillations for a query (docs/RECALL.md): calibrated relevance gated per
    tier, times recency decay, (1 + warmth) and tier gravity; empty when nothing is relevant.
    ``as_of`` recalls as of a past moment; ``explain`` adds each hit's score breakdown. 404 when
    the user has no memories at all, so a mistyped user id is not mistaken for "nothing relevant"."""
    user_id = caller.acting_for(body.user_id)
    started = time.perf_counter()
    hits = search_memories(services.database, services.embedder, user_id=user_id, query=body.query,
                           params=services.recall_params(threshold=body.threshold, limit=body.limit),
                           model=services.relevance_model, as_of=body.as_of,
                           judge=services.judge)
    services.metrics.observe_recall((time.perf_counter() - started) * 1000)
    if not hits:
        # Asked only when nothing was found, so a successful search costs nothing more.
        if not user_has_memories(services.database, user_id):
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"user {user_id!r} has no memories")
    return [SearchHit(id=h.id, kind=h.kind, memory_id=h.memory_id, content=h.content, reply=h.reply,
                      confidence=h.confidence, tier=h.tier,
                      memory_type=h.memory_type, event_on=h.event_on,
                      warmth=h.warmth, similarity=h.similarity, relevance=h.relevance, score=h.score, rank_odds=h.rank_odds,
                      is_core=h.is_core, occurred_at=h.occurred_at, superseded_by=h.superseded_by,
                      in_conflict=h.in_conflict, explain=h.explain() if body.explain else None) for h in hits]


@router.get("", response_model=DistillationPage)
def list_distillations_route(
    caller: Caller,
    services: Services,
    user_id: Annotated[UserId | None, Query(description="Only this user's (a user key: its own).")] = None,
    distillation_status: Annotated[Literal["active", "review", "rejected", "merged"] | None,
                                   Query(alias="status")] = None,
    needs_review: bool | None = None,
    memory_id: UUID | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> DistillationPage:
    """List live distillations, newest first."""
    rows = list_distillations(services.database, user_id=caller.user_filter(user_id), status=distillation_status,
                              memory_id=memory_id, needs_review=needs_review, limit=limit + 1, offset=offset)
    return DistillationPage(items=rows_to(DistillationOut, rows[:limit]), limit=limit, offset=offset,
                            next_offset=offset + limit if len(rows) > limit else None)


@router.post("/merge", response_model=DistillationDetail)
def merge(body: MergeRequest, caller: Caller, services: Services) -> DistillationDetail:
    """Merge two of a user's distillations: the kept one gets a new version (``merged_from`` the
    other), the other becomes ``merged``. Without ``content`` the LLM writes the merged text."""
    outcome = merge_distillations(services.database, services.llm, services.embedder, keep_id=body.keep_id,
                                  merge_id=body.merge_id, content=body.content, user_id=caller.scope,
                                  actor=caller.actor)
    if outcome.result != "merged":
        raise HTTPException(_MERGE_REFUSALS[outcome.result], outcome.detail)
    return _detail(services.database, body.keep_id, caller.scope)


@router.get("/{distillation_id}", response_model=DistillationDetail)
def show(distillation_id: UUID, caller: Caller, services: Services) -> DistillationDetail:
    """One distillation with every version of its text, oldest first."""
    return _detail(services.database, distillation_id, caller.scope)


@router.post("/{distillation_id}/versions", response_model=DistillationDetail, status_code=status.HTTP_201_CREATED)
def add_manual_version(distillation_id: UUID, body: ManualVersion, caller: Caller,
                       services: Services) -> DistillationDetail:
    """Replace a distillation's text with a person's; the previous text stays as a version."""
    if not write_manual_version(services.database, services.embedder, distillation_id, content=body.content,
                                user_id=caller.scope, actor=caller.actor):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"distillation {distillation_id} not found")
    return _detail(services.database, distillation_id, caller.scope)


@router.post("/{distillation_id}/re-embed", response_model=DistillationDetail)
def reembed(distillation_id: UUID, caller: Caller, services: Services) -> DistillationDetail:
    """Embed a distillation's text again with the active embedding model."""
    if not reembed_distillation(services.database, services.embedder, distillation_id, user_id=caller.scope,
                                actor=caller.actor):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"distillation {distillation_id} not found")
    return _detail(services.database, distillation_id, caller.scope)


@router.post("/{distillation_id}/weight", response_model=DistillationDetail)
def set_weight(distillation_id: UUID, body: WeightUpdate, caller: Caller, services: Services) -> DistillationDetail:
    """Pin a distillation (or unpin it): set its ``user_weight``, a factor of recall's gravity
    (tier gravity × user_weight); 1 is neutral. Audited with the weight before and after."""
    before = set_distillation_weight(services.database, distillation_id, user_weight=body.user_weight,
                                     user_id=caller.scope, actor=caller.actor)
    if before is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"distillation {distillation_id} not found")
    return _detail(services.database, distillation_id, caller.scope)


@router.post("/{distillation_id}/tier", response_model=DistillationDetail)
def set_tier(distillation_id: UUID, body: TierUpdate, caller: Caller, services: Services) -> DistillationDetail:
    """Set a distillation's tier (``core``, ``medium``, ``low``): how much it weighs in recall and
    how close a query must come. Audited with the tier before and after (the web page's tier form
    calls the same service)."""
    before = set_distillation_tier(services.database, distillation_id, tier=body.tier, user_id=caller.scope,
                                   actor=caller.actor)
    if before is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"distillation {distillation_id} not found")
    return _detail(services.database, distillation_id, caller.scope)


@router.post("/{distillation_id}/type", response_model=DistillationDetail)
def set_type(distillation_id: UUID, body: TypeUpdate, caller: Caller, services: Services) -> DistillationDetail:
    """Set a distillation's type (``instruction``, ``preference``, ``fact``, ``event``): what kind of
    thing it says, as MEMORY.md groups it. An event is dated from its exchange's words (against when
    they were said). It does not change recall's ranking. Audited with the type before and after
    (the web page's type form calls the same service)."""
    before = set_memory_type(services.database, distillation_id, memory_type=body.memory_type, user_id=caller.scope,
                             actor=caller.actor)
    if before is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"distillation {distillation_id} not found")
    return _detail(services.database, distillation_id, caller.scope)
