"""A user's MEMORY.md: what Yak knows about them now, rebuilt from the database at any time.

The one function behind ``yak export --format md``, ``GET /api/export/memory.md`` and the MCP
resource ``yak://memory.md``.
"""

from __future__ import annotations

from yak_pipeline.core.memory_markdown import render_memory_markdown
from yak_pipeline.store.database import Database
from yak_pipeline.store.knowledge import current_knowledge


def memory_markdown(db: Database, user_id: str) -> tuple[str, int]:
    """``(MEMORY.md text, how many memories it lists)`` for ``user_id``."""
    with db.connection() as conn:
        items = current_knowledge(conn, user_id)
    return render_memory_markdown(user_id, items), len(items)
