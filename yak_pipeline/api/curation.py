"""A person's edits to distillations: a manual version, a merge of two, a re-embed.

The LLM and the embedder are called before the transaction opens, so no row stays locked
while a model thinks; the writes go through the store's versioning functions, so every text
change leaves a version and an audit row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from uuid import UUID

from yak_pipeline.embeddings import Embedder
from yak_pipeline.llm.provider import LLMProvider
from yak_pipeline.store.database import Database
from yak_pipeline.store.distillations import add_version, get_distillation, set_distillation_status
from yak_pipeline.store.reembed import replace_embedding

MERGEABLE_STATUSES = ("active", "review")


def write_manual_version(db: Database, embedder: Embedder, distillation_id: UUID, *, content: str,
                         user_id: str | None, actor: str) -> bool:
    """Give a distillation new text from a person; False when it is not found (for ``user_id``)."""
    vector = embedder.embed_documents([content])[0]
    with db.connection() as conn:
        if get_distillation(conn, distillation_id, user_id=user_id) is None:
            return False
        add_version(conn, distillation_id, content=content, embedding=vector, embedding_model=embedder.model_name,
                    reason="manual", actor=actor)
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
