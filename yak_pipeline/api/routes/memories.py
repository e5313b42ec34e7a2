"""``/api/memories``: store exchanges, list, show and delete raw memories."""

from __future__ import annotations

from typing import Annotated, Literal
from uuid import UUID

from fastapi import APIRouter, HTTPException, Query, Response, status

from yak_pipeline.api.dependencies import Caller, Services
from yak_pipeline.api.schemas.base import UserId, rows_to
from yak_pipeline.api.schemas.forget import ForgetResult
from yak_pipeline.api.schemas.memories import DistillationSummary, MemoryCreate, MemoryDetail, MemoryOut, MemoryPage
from yak_pipeline.services.memories import forget_memory, list_memories, memory_with_distillations, store_memory

router = APIRouter(prefix="/api/memories", tags=["memories"])


@router.post("/", status_code=status.HTTP_201_CREATED, response_model=MemoryOut,
             responses={200: {"description": "The same exchange was already stored; that memory is returned.",
                              "model": MemoryOut},
                        409: {"description": "The user forgot this exchange with a soft delete; it is not stored again."}})
def create_memory(body: MemoryCreate, caller: Caller, services: Services, response: Response) -> MemoryOut:
    """Store one exchange as a ``pending`` memory, recallable at once as the user's words (its
    vectors are made before the answer); the pipeline's inbox sensor distils it.

    The same text for the same user is stored once: posting it again answers 200 with the
    memory already stored, or 409 when the user forgot it with a soft delete (its row is kept, hidden).
    """
    user_id = caller.acting_for(body.user_id)
    created, row = store_memory(services.database, user_id=user_id, content=body.content, source="api",
                                occurred_at=body.occurred_at, actor=caller.actor, embedder=services.embedder)
    if not created:
        response.status_code = status.HTTP_200_OK
    return MemoryOut.model_validate(row)


router.add_api_route("", create_memory, methods=["POST"], status_code=status.HTTP_201_CREATED,
                     response_model=MemoryOut, include_in_schema=False)


@router.get("", response_model=MemoryPage)
def list_memories_route(
    caller: Caller,
    services: Services,
    user_id: Annotated[UserId | None, Query(description="Only this user's memories (a user key: its own).")] = None,
    memory_status: Annotated[Literal["pending", "distilled", "failed"] | None, Query(alias="status")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> MemoryPage:
    """List live memories, newest exchange first, a page at a time."""
    rows = list_memories(services.database, user_id=caller.user_filter(user_id), status=memory_status,
                         limit=limit + 1, offset=offset)
    return MemoryPage(items=rows_to(MemoryOut, rows[:limit]), limit=limit, offset=offset,
                      next_offset=offset + limit if len(rows) > limit else None)


router.add_api_route("/", list_memories_route, methods=["GET"], response_model=MemoryPage, include_in_schema=False)


@router.get("/{memory_id}", response_model=MemoryDetail)
def show_memory(memory_id: UUID, caller: Caller, services: Services) -> MemoryDetail:
    """One memory: its full text, processing state and distillations."""
    found = memory_with_distillations(services.database, memory_id, user_id=caller.scope)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"memory {memory_id} not found")
    row, distillations = found
    return MemoryDetail.model_validate({**row, "distillations": rows_to(DistillationSummary, distillations)})


@router.delete("/{memory_id}", response_model=ForgetResult)
def delete_memory(
    memory_id: UUID,
    caller: Caller,
    services: Services,
    soft: Annotated[bool, Query(description="Keep the rows but hide them from every read path.")] = False,
) -> ForgetResult:
    """Forget one memory: the raw exchange, its distillations, versions, embeddings, warmth
    events, conflicts and turns (DESIGN §4); an audit row records ids only."""
    report = forget_memory(services.database, memory_id, user_id=caller.scope, actor=caller.actor, soft=soft)
    if report is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"memory {memory_id} not found")
    return ForgetResult(action="deleted", deleted_memory_ids=report.memory_ids,
                        deleted_distillation_ids=report.distillation_ids)
