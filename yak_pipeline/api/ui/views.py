"""The pages that show one user's memory: overview, search, one memory, recent changes, the
review queue, conflicts and the pipeline's state. They read through the same services as the
API's routes, with the same scoping (the user in the URL, checked against the key)."""

from __future__ import annotations

import time
from typing import Annotated, Final
from uuid import UUID

from fastapi import APIRouter, Query, Request, Response

from yak_pipeline.api.dependencies import Services
from yak_pipeline.api.ui.access import PREFIX, PageError, PageRoute, SignedIn, Visitor, render, user_page
from yak_pipeline.core.dedup import newer_side
from yak_pipeline.core.types import MEMORY_TYPES, TIERS
from yak_pipeline.ingestion.drop_folder import failed_dir, list_quarantine
from yak_pipeline.services.curation import MAX_USER_WEIGHT, list_conflicts, review_queue
from yak_pipeline.services.memories import user_has_memories
from yak_pipeline.services.overview import distillation_page, exchanges_of, recent_changes, user_overview
from yak_pipeline.services.profile import show_profile
from yak_pipeline.services.queue_watch import queue_status
from yak_pipeline.services.recall import search_memories

router = APIRouter(prefix=f"{PREFIX}/u/{{user_id}}", include_in_schema=False, route_class=PageRoute)

# Pages stay short; the CLI and the API page through everything.
PAGE_ROWS: Final = 50
MAX_QUARANTINE_SHOWN: Final = 20


# How the other side of a conflict compares with this memory, by when each was said.
_OTHER_SIDE: Final = {"a": "newer", "b": "older", None: "said at the same moment"}


def _dagster_links(services: Services) -> dict[str, str]:
    base = services.settings.dagster_ui_url.rstrip("/")
    return {"runs": f"{base}/runs", "assets": f"{base}/assets", "home": base}


def render_overview(request: Request, visitor: Visitor, services: Services, user_id: str, *, draft: str = "",
                    said_on: str = "", error: str | None = None, status_code: int = 200) -> Response:
    """The overview page; after a refused "add a memory" form, with what was typed kept and the reason."""
    counts, queue = user_overview(services.database, services.alerter, user_id)
    return render(request, "overview.html", visitor=visitor, user_id=user_id, counts=counts, queue=queue,
                  dagster=_dagster_links(services), draft=draft, said_on=said_on, error=error,
                  status_code=status_code, section="overview")


@router.get("")
def overview(request: Request, user_id: str, visitor: SignedIn, services: Services) -> Response:
    """A user's memory at a glance: counts, what waits for a person, the pipeline's state, and a
    form to add a memory."""
    user_page(visitor, user_id)
    return render_overview(request, visitor, services, user_id)


@router.get("/search")
def search(
    request: Request,
    user_id: str,
    visitor: SignedIn,
    services: Services,
    q: Annotated[str, Query(max_length=4_000)] = "",
    threshold: Annotated[float, Query(ge=0.0, le=1.0)] = 0.7,
    limit: Annotated[int, Query(ge=1, le=50)] = 10,
) -> Response:
    """Recall for a query with the default engine (the API's search), each hit with its score
    breakdown and, on demand, its raw exchange."""
    user_page(visitor, user_id)
    query = q.strip()
    hits, exchanges, note = [], {}, None
    if query:
        started = time.perf_counter()
        hits = search_memories(services.database, services.embedder, user_id=user_id, query=query,
                               params=services.recall_params(threshold=threshold, limit=limit),
                               model=services.relevance_model,
                               judge=services.judge)
        services.metrics.observe_recall((time.perf_counter() - started) * 1000)
        exchanges = exchanges_of(services.database, [h.memory_id for h in hits], user_id=user_id)
        if not hits and not user_has_memories(services.database, user_id):
            note = f"user {user_id!r} has no memories"
    return render(request, "search.html", visitor=visitor, user_id=user_id, query=query, threshold=threshold,
                  limit=limit, hits=hits, exchanges=exchanges, note=note, section="search")


@router.get("/d/{distillation_id}")
def distillation(request: Request, user_id: str, distillation_id: UUID, visitor: SignedIn,
                 services: Services) -> Response:
    """One memory: its text and every version (what changed, merged from where), its raw exchange,
    warmth history, open conflicts and supersession, with edit, tier, type, pin, review and forget."""
    user_page(visitor, user_id)
    return render_distillation(request, visitor, services, user_id, distillation_id)


def render_distillation(request: Request, visitor: Visitor, services: Services, user_id: str,
                        distillation_id: UUID, *, draft: str | None = None, error: str | None = None,
                        status_code: int = 200) -> Response:
    """One memory's page; after a refused edit, with the typed text kept in the editor and the reason."""
    page = distillation_page(services.database, distillation_id, user_id=user_id)
    if page is None:
        raise PageError(404, f"distillation {distillation_id} not found")
    said = page["exchange"]["occurred_at"] if page["exchange"] else None
    page["conflicts"] = [{**c, "other_is": _OTHER_SIDE[newer_side(c["other_said_at"], said) if said else None]}
                         for c in page["conflicts"]]
    return render(request, "distillation.html", visitor=visitor, user_id=user_id, **page, max_weight=MAX_USER_WEIGHT,
                  tiers=TIERS, memory_types=MEMORY_TYPES, draft=page["d"]["content"] if draft is None else draft, error=error,
                  status_code=status_code, section="recent")


@router.get("/profile")
def profile(request: Request, user_id: str, visitor: SignedIn, services: Services) -> Response:
    """The profile: exactly the standing instructions and preferences every memory block carries,
    then the lines it does not carry and why, each with "drop" (or "put back") and "forget"."""
    user_page(visitor, user_id)
    shown = show_profile(services.database, user_id, token_budget=services.settings.profile_tokens).as_dict()
    return render(request, "profile.html", visitor=visitor, user_id=user_id, profile=shown, section="profile")


@router.get("/recent")
def recent(request: Request, user_id: str, visitor: SignedIn, services: Services) -> Response:
    """The latest changed distillations (with their versions and merges) and the latest exchanges."""
    user_page(visitor, user_id)
    distillations, memories = recent_changes(services.database, user_id, limit=PAGE_ROWS)
    return render(request, "recent.html", visitor=visitor, user_id=user_id, distillations=distillations,
                  memories=memories, section="recent")


@router.get("/review")
def review(request: Request, user_id: str, visitor: SignedIn, services: Services) -> Response:
    """The review queue, oldest first: approve (recallable) or reject (kept, never recalled)."""
    user_page(visitor, user_id)
    items = review_queue(services.database, user_id=user_id, limit=PAGE_ROWS)
    return render(request, "review.html", visitor=visitor, user_id=user_id, items=items, section="review")


@router.get("/conflicts")
def conflicts(request: Request, user_id: str, visitor: SignedIn, services: Services) -> Response:
    """Open conflicts, each side's text and when it was said, the newer side named: keep one,
    keep both, or dismiss."""
    user_page(visitor, user_id)
    items = [{**c, "newer": newer_side(c["said_a"], c["said_b"])}
             for c in list_conflicts(services.database, user_id=user_id, status="open", limit=PAGE_ROWS)]
    return render(request, "conflicts.html", visitor=visitor, user_id=user_id, items=items, section="conflicts")


@router.get("/pipeline")
def pipeline(request: Request, user_id: str, visitor: SignedIn, services: Services) -> Response:
    """What waits for the pipeline and what failed, with the reasons; for admins also the drop
    folder's quarantine (files and records it refused, with the reasons), and links to the
    Dagster UI for runs and lineage."""
    user_page(visitor, user_id)
    queue, failed = queue_status(services.database, services.alerter, user_id=user_id)
    quarantine, folder = None, None
    if visitor.caller.is_admin:
        drop_dir = services.settings.resolved_drop_dir
        quarantine, folder = list_quarantine(drop_dir)[:MAX_QUARANTINE_SHOWN], failed_dir(drop_dir)
    return render(request, "pipeline.html", visitor=visitor, user_id=user_id, queue=queue, failed=failed,
                  quarantine=quarantine, quarantine_folder=folder, dagster=_dagster_links(services),
                  section="pipeline")
