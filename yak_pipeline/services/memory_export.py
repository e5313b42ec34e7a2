"""A user's MEMORY.md: what Yak knows about them now, rebuilt from the database at any time.

The one function behind ``yak export --format md``, ``GET /api/export/memory.md`` and the MCP
resource ``yak://memory.md``.
"""

from __future__ import annotations

from yak_pipeline.core.memory_markdown import render_memory_markdown
from yak_pipeline.store.database import Database
from yak_pipeline.store.knowledge import current_knowledge
from yak_pipeline.store.memories import user_has_memories
from yak_pipeline.store.profile import profile_lines


class UnknownUser(LookupError):
    """The user has no memories at all (Yak has no user registry: a user is their memories)."""


def memory_markdown(db: Database, user_id: str, *, known_only: bool = True) -> tuple[str, int]:
    """``(MEMORY.md text, how many memories it lists)`` for ``user_id``.

    With ``known_only``, a user without any memory (a mistyped id, say) raises :class:`UnknownUser`
    instead of getting an empty file.
    """
    with db.connection() as conn:
        if known_only and not user_has_memories(conn, user_id):
            raise UnknownUser(f"user {user_id!r} has no memories")
        items = current_knowledge(conn, user_id)
        # The profile as the user keeps it (dropped lines left out), whatever the block's budget.
        profile = [(line.kind, line.text, line.said_at) for line in profile_lines(conn, user_id)]
    return render_memory_markdown(user_id, items, profile), len(items)
