"""A person's curation of distillations: reading them, editing, merging, re-embedding, pinning,
changing the tier and the type, the review queue and settling conflicts (what the API and the web page offer).

The LLM and the embedder are called before the transaction opens, so no row stays locked
while a model thinks; the writes go through the store's versioning functions, so every text
change leaves a version and an audit row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal
from uuid import UUID

from yak_pipeline.core.secrets import screen_secrets
from yak_pipeline.embeddings import Embedder
from yak_pipeline.llm.provider import LLMProvider
from yak_pipeline.store import conflicts as conflicts_store
from yak_pipeline.store import distillations as distillations_store
from yak_pipeline.store import review as review_store
from yak_pipeline.store.database import Database
from yak_pipeline.store.distillations import MAX_USER_WEIGHT, add_version, get_distillation, set_distillation_status
from yak_pipeline.store.memory_types import TypeBefore
from yak_pipeline.store.memory_types import set_memory_type as store_set_memory_type
from yak_pipeline.store.reembed import replace_embedding
from yak_pipeline.store.review import ReviewOutcome
from yak_pipeline.store.secret_redactions import record_redaction

__all__ = ["MAX_USER_WEIGHT", "ReviewOutcome"]  # re-exported for the shells, which import no store module

MERGEABLE_STATUSES = ("active", "review")


def write_manual_version(db: Database, embedder: Embedder, distillation_id: UUID, *, content: str,
                         user_id: str | None, actor: str) -> bool:
    """Give a distillation new text from a person; False when it is not found (for ``user_id``).

    A secret in the text is replaced (or refused) before it is embedded or stored, as for an exchange."""
    screened = screen_secrets(content, db.secrets)
    vector = embedder.embed_documents([screened.text])[0]
    with db.connection() as conn:
        found = get_distillation(conn, distillation_id, user_id=user_id)
        if found is None:
            return False
        add_version(conn, distillation_id, content=screened.text, embedding=vector,
                    embedding_model=embedder.model_name, reason="manual", actor=actor)
        record_redaction(conn, kinds=screened.kinds, actor=actor, user_id=found["user_id"],
                         target_type="distillation", target_id=distillation_id)
    return True


@dataclass(frozen=True)
class MergeOutcome:
    """``merged``, or why not: an id not found, two users, a status that cannot merge, the same id."""

    result: Literal["merged", "not_found", "different_users", "not_mergeable", "same_id"]
    detail: str = ""


def merge_distillations(db: Database, llm: LLMProvider, embedder: Embedder, *, keep_id: UUID, merge_id: UUID,
                        content: str | None, user_id: str | None, actor: str) -> MergeOutcome:
    """Merge ``merge_id`` into ``keep_id`` (DESIGN §4's consolidation, asked for by a person).

    Without ``content`` the LLM consolidates the two texts, older first. Raises the LLM's or
    embedder's error when they fail.
    """
    if keep_id == merge_id:
        return MergeOutcome("same_id", "a distillation cannot be merged into itself")
    with db.connection() as conn:
        keep = get_distillation(conn, keep_id, user_id=user_id)
        other = get_distillation(conn, merge_id, user_id=user_id)
    if keep is None or other is None:
        return MergeOutcome("not_found", f"distillation {merge_id if keep is not None else keep_id} not found")
    if keep["user_id"] != other["user_id"]:
        return MergeOutcome("different_users", "distillations of different users are never merged")
    for row in (keep, other):
        if row["status"] not in MERGEABLE_STATUSES:
            return MergeOutcome("not_mergeable", f"distillation {row['id']} is {row['status']}")
    if content is None:
        older, newer = sorted((keep, other), key=lambda r: (r["created_at"], str(r["id"])))
        content = llm.consolidate(older["content"], newer["content"]).content
    else:  # a person's text: screened for secrets as any other write
        content = screen_secrets(content, db.secrets).text
    vector = embedder.embed_documents([content])[0]
    with db.connection() as conn:
        add_version(conn, keep_id, content=content, embedding=vector, embedding_model=embedder.model_name,
                    reason="merged", merged_from=[merge_id], actor=actor)
        set_distillation_status(conn, merge_id, status="merged", needs_review=False, actor=actor, action="merge")
    return MergeOutcome("merged")


def reembed_distillation(db: Database, embedder: Embedder, distillation_id: UUID, *, user_id: str | None,
                         actor: str) -> bool:
    """Embed a distillation's current text with the active model; False when it is not found."""
    with db.connection() as conn:
        row = get_distillation(conn, distillation_id, user_id=user_id)
    if row is None:
        return False
    vector = embedder.embed_documents([row["content"]])[0]
    with db.connection() as conn:
        return replace_embedding(conn, distillation_id, embedding=vector, embedding_model=embedder.model_name,
                                 user_id=user_id, actor=actor)


def distillation_with_versions(db: Database, distillation_id: UUID | str, *,
                               user_id: str | None) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """A live distillation (for ``user_id``) and its versions, oldest first; None when not found."""
    with db.connection() as conn:
        row = get_distillation(conn, distillation_id, user_id=user_id)
        if row is None:
            return None
        return row, distillations_store.list_versions(conn, distillation_id)


def find_distillation(db: Database, distillation_id: UUID | str, *, user_id: str | None) -> dict[str, Any] | None:
    """A live distillation (for ``user_id``), or None."""
    with db.connection() as conn:
        return get_distillation(conn, distillation_id, user_id=user_id)


def list_distillations(db: Database, **filters: Any) -> list[dict[str, Any]]:
    """Live distillations, newest first (filters as :func:`yak_pipeline.store.distillations.list_distillations`)."""
    with db.connection() as conn:
        return distillations_store.list_distillations(conn, **filters)


def set_weight(db: Database, distillation_id: UUID | str, *, user_weight: float, user_id: str | None,
               actor: str) -> float | None:
    """Pin or unpin a distillation; the previous weight, or None when not found (``ValueError`` when out of range)."""
    with db.connection() as conn:
        return distillations_store.set_user_weight(conn, distillation_id, user_weight=user_weight, user_id=user_id,
                                                   actor=actor)


def set_tier(db: Database, distillation_id: UUID | str, *, tier: str, user_id: str | None,
             actor: str) -> str | None:
    """A person's tier for a distillation (audited); the previous tier, or None when not found
    (``ValueError`` for a tier that does not exist)."""
    with db.connection() as conn:
        return distillations_store.set_tier(conn, distillation_id, tier=tier, user_id=user_id, actor=actor)


def set_memory_type(db: Database, distillation_id: UUID | str, *, memory_type: str, user_id: str | None,
                    actor: str) -> TypeBefore | None:
    """A person's type for a distillation (audited, before and after; an event dated from its
    exchange); the previous ``(type, event_on)``, or None when not found (``ValueError`` for a type
    that does not exist)."""
    with db.connection() as conn:
        return store_set_memory_type(conn, distillation_id, memory_type=memory_type, user_id=user_id, actor=actor)


def review_queue(db: Database, *, user_id: str | None, limit: int = 50, offset: int = 0) -> list[dict[str, Any]]:
    """Flagged distillations waiting for a person, oldest first."""
    with db.connection() as conn:
        return review_store.list_review_queue(conn, user_id=user_id, limit=limit, offset=offset)


def review(db: Database, distillation_id: UUID | str, decision: Literal["approve", "reject"], *,
           user_id: str | None, actor: str) -> ReviewOutcome:
    """A person's decision on a flagged distillation: approved, rejected, or why not."""
    decide = review_store.approve_distillation if decision == "approve" else review_store.reject_distillation
    with db.connection() as conn:
        return decide(conn, distillation_id, user_id=user_id, actor=actor)


def list_conflicts(db: Database, *, user_id: str | None, status: str | None, limit: int = 50) -> list[dict[str, Any]]:
    """Conflicts with both sides' text, newest first."""
    with db.connection() as conn:
        return conflicts_store.list_conflicts(conn, user_id=user_id, status=status, limit=limit)


def open_conflicts_of(db: Database, distillation_id: UUID | str) -> list[dict[str, Any]]:
    """The open conflicts a distillation is one side of."""
    with db.connection() as conn:
        return conflicts_store.open_conflicts_of(conn, distillation_id)


def close_conflict(db: Database, conflict_id: UUID | str, *, status: Literal["resolved", "dismissed"],
                   keep: conflicts_store.ConflictKeep | None = None, resolution: str | None = None,
                   user_id: str | None, actor: str) -> bool:
    """Resolve or dismiss an open conflict, resolved by keeping side ``a``, ``b`` or ``both`` when
    ``keep`` says so; False when there is no such open conflict."""
    with db.connection() as conn:
        return conflicts_store.close_conflict(conn, conflict_id, status=status, keep=keep, resolution=resolution,
                                              user_id=user_id, actor=actor)
