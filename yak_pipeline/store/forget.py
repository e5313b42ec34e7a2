"""Forget (DESIGN §4): a memory and everything derived from it, gone from every table and read path.

Deleting the memory cascades to its distillations, their versions, embeddings, warmth events,
conflicts and the turns it was stored from. Two things do not cascade by foreign key and are
handled here: versions of *other* distillations that were consolidated from a forgotten one
(``merged_from``) carry its text, so they are removed and the distillation is restored to its
last untouched version; and turns that merely recalled a forgotten distillation drop its id.
The warmth a forgotten turn's evaluations gave other memories is taken back, with an event
saying so (``store.warmth.undo_turn_warmth``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import dict_row

from yak_pipeline.core.profile import profile_reference
from yak_pipeline.store.audit import write_audit
from yak_pipeline.store.warmth import undo_turn_warmth


@dataclass
class ForgetReport:
    """What one forget removed."""

    memory_ids: list[str] = field(default_factory=list)
    distillation_ids: list[str] = field(default_factory=list)
    versions_removed: int = 0
    restored_distillations: list[str] = field(default_factory=list)
    # Memories whose warmth a forgotten turn had changed, moved back.
    warmth_undone: int = 0
    soft: bool = False


def resolve_memory_ids(conn: psycopg.Connection, *, user_id: str, ids: Sequence[UUID | str]) -> list[str]:
    """Map ids that are the user's memories or distillations to memory ids; others are ignored."""
    rows = conn.execute(
        """SELECT id FROM memories WHERE id = ANY(%(ids)s::uuid[]) AND user_id = %(user)s AND deleted_at IS NULL
           UNION
           SELECT memory_id FROM distillations
           WHERE id = ANY(%(ids)s::uuid[]) AND user_id = %(user)s AND deleted_at IS NULL""",
        {"ids": [str(i) for i in ids], "user": user_id},
    ).fetchall()
    return sorted(str(r[0]) for r in rows)


def find_forget_candidates(
    conn: psycopg.Connection, *, user_id: str, phrase: str, limit: int = 20
) -> list[dict[str, Any]]:
    """The user's memories whose exchange or distillation contains ``phrase`` (case-insensitive);
    for a phrase naming the profile ("that preference", "my instructions":
    ``core.profile.profile_reference``), the memories holding the newest such line (or all of them).

    Candidates only: a phrase never deletes without confirmation.
    """
    reference = profile_reference(phrase)
    pattern = "%" + phrase.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    matching = """(m.content ILIKE %(pattern)s OR EXISTS (
                        SELECT 1 FROM distillations d WHERE d.memory_id = m.id AND d.deleted_at IS NULL
                          AND d.content ILIKE %(pattern)s))"""
    if reference is not None:
        matching = """m.id IN (SELECT p.memory_id FROM profile_lines p JOIN memories pm ON pm.id = p.memory_id
                                WHERE p.user_id = %(user)s AND p.kind = %(kind)s AND p.status = 'active'
                                  AND pm.deleted_at IS NULL
                                ORDER BY pm.occurred_at DESC LIMIT %(lines)s)"""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT m.id AS memory_id, m.occurred_at, left(m.content, 300) AS content,
                      (SELECT array_agg(d.content ORDER BY d.created_at) FROM distillations d
                        WHERE d.memory_id = m.id AND d.deleted_at IS NULL) AS distillations
               FROM memories m
               WHERE m.user_id = %(user)s AND m.deleted_at IS NULL AND """ + matching + """
               ORDER BY m.occurred_at DESC LIMIT %(limit)s""",
            {"user": user_id, "pattern": pattern, "limit": limit,
             "kind": reference[0] if reference else None, "lines": limit if reference and reference[1] else 1},
        ).fetchall()


def _reactivate(conn: psycopg.Connection, distillation_ids: set[str]) -> None:
    """Give distillations that had been merged into a now-removed text their own life back."""
    if distillation_ids:
        conn.execute(
            """UPDATE distillations SET status = 'active', updated_at = now()
               WHERE id = ANY(%(distillation_ids)s::uuid[]) AND status = 'merged' AND deleted_at IS NULL""",
            {"distillation_ids": sorted(distillation_ids)},
        )


def _purge_merged_versions(
    conn: psycopg.Connection, user_id: str, forgotten: list[str], soft: bool, report: ForgetReport
) -> None:
    """Remove versions consolidated from forgotten text and restore their distillations.

    Taint spreads: once a distillation absorbed forgotten text, any version consolidated from it
    may carry that text too, so the search repeats with it until nothing new is tainted. This
    errs towards undoing a consolidation; no fact is lost, since every absorbed distillation
    gets its own life back.
    """
    tainted = set(forgotten)
    while True:
        affected = conn.execute(
            """SELECT v.distillation_id, min(v.version)
               FROM distillation_versions v JOIN distillations d ON d.id = v.distillation_id
               WHERE d.user_id = %(user)s AND v.deleted_at IS NULL AND v.merged_from && %(ids)s::uuid[]
                 AND NOT (v.distillation_id = ANY(%(ids)s::uuid[]))
               GROUP BY v.distillation_id ORDER BY v.distillation_id""",
            {"user": user_id, "ids": sorted(tainted)},
        ).fetchall()
        if not affected:
            return
        for distillation_id, first_tainted in affected:
            _restore_before(conn, str(distillation_id), first_tainted, set(forgotten), soft, report)
            tainted.add(str(distillation_id))


def _restore_before(
    conn: psycopg.Connection, distillation_id: str, first_tainted: int, forgotten: set[str], soft: bool,
    report: ForgetReport,
) -> None:
    """Drop a distillation's versions from ``first_tainted`` on and go back to the latest one left."""
    conn.execute("SELECT 1 FROM distillations WHERE id = %(distillation_id)s FOR UPDATE", {"distillation_id": distillation_id})
    # Later versions were consolidated from a tainted text, so they carry it too.
    removed = conn.execute(
        """SELECT version, merged_from FROM distillation_versions
           WHERE distillation_id = %(distillation_id)s AND version >= %(first_tainted)s AND deleted_at IS NULL""",
        {"distillation_id": distillation_id, "first_tainted": first_tainted},
    ).fetchall()
    if soft:
        conn.execute(
            "UPDATE distillation_versions SET deleted_at = now() WHERE distillation_id = %(distillation_id)s AND version >= %(first_tainted)s",
            {"distillation_id": distillation_id, "first_tainted": first_tainted},
        )
    else:
        conn.execute(
            "DELETE FROM distillation_versions WHERE distillation_id = %(distillation_id)s AND version >= %(first_tainted)s",
            {"distillation_id": distillation_id, "first_tainted": first_tainted},
        )
    report.versions_removed += len(removed)
    _reactivate(conn, {str(m) for _, merged in removed for m in merged} - forgotten)
    conn.execute(
        """UPDATE distillations d SET content = v.content, embedding = v.embedding,
                  embedding_model = v.embedding_model, updated_at = now()
           FROM (SELECT content, embedding, embedding_model FROM distillation_versions
                 WHERE distillation_id = %(id)s AND deleted_at IS NULL
                 ORDER BY version DESC LIMIT 1) v
           WHERE d.id = %(id)s""",
        {"id": distillation_id},
    )
    report.restored_distillations.append(distillation_id)


def forget_memories(
    conn: psycopg.Connection,
    *,
    user_id: str,
    memory_ids: Sequence[UUID | str],
    actor: str,
    soft: bool = False,
) -> ForgetReport:
    """Forget the user's memories (ids of other users' rows are ignored), in the caller's transaction.

    ``soft`` keeps the rows but hides them from every read path (``deleted_at``); otherwise they
    are deleted. Either way one audit row per memory records it, with ids and counts only.
    """
    report = ForgetReport(soft=soft)
    locked = conn.execute(
        """SELECT id FROM memories WHERE id = ANY(%(memory_ids)s::uuid[]) AND user_id = %(user_id)s AND deleted_at IS NULL
           ORDER BY id FOR UPDATE""",
        {"memory_ids": [str(i) for i in memory_ids], "user_id": user_id},
    ).fetchall()
    report.memory_ids = [str(r[0]) for r in locked]
    if not report.memory_ids:
        return report
    per_memory = conn.execute(
        """SELECT memory_id, array_agg(id) FROM distillations WHERE memory_id = ANY(%(memory_ids)s::uuid[]) GROUP BY memory_id""",
        {"memory_ids": report.memory_ids},
    ).fetchall()
    by_memory = {str(m): [str(d) for d in ds] for m, ds in per_memory}
    report.distillation_ids = sorted(d for ds in by_memory.values() for d in ds)

    if report.distillation_ids:
        _purge_merged_versions(conn, user_id, report.distillation_ids, soft, report)
        # Facts merged *into* a forgotten distillation were not forgotten: they become active again.
        absorbed = conn.execute(
            "SELECT DISTINCT unnest(merged_from) FROM distillation_versions WHERE distillation_id = ANY(%(distillation_ids)s::uuid[])",
            {"distillation_ids": report.distillation_ids},
        ).fetchall()
        _reactivate(conn, {str(r[0]) for r in absorbed} - set(report.distillation_ids))
        conn.execute(
            """UPDATE turns SET recalled_ids = ARRAY(SELECT unnest(recalled_ids) EXCEPT SELECT unnest(%(ids)s::uuid[]))
               WHERE user_id = %(user)s AND recalled_ids && %(ids)s::uuid[]""",
            {"ids": report.distillation_ids, "user": user_id},
        )
    report.warmth_undone = undo_turn_warmth(conn, user_id=user_id, memory_ids=report.memory_ids,
                                            keep_out=report.distillation_ids, actor=actor)
    if soft:
        conn.execute("UPDATE memories SET deleted_at = now() WHERE id = ANY(%(memory_ids)s::uuid[])", {"memory_ids": report.memory_ids})
        conn.execute(
            "UPDATE distillations SET deleted_at = now() WHERE memory_id = ANY(%(memory_ids)s::uuid[])",
            {"memory_ids": report.memory_ids},
        )
        conn.execute(
            "UPDATE distillation_versions SET deleted_at = now() WHERE distillation_id = ANY(%(distillation_ids)s::uuid[])",
            {"distillation_ids": report.distillation_ids},
        )
        conn.execute("UPDATE turns SET deleted_at = now() WHERE memory_id = ANY(%(memory_ids)s::uuid[])", {"memory_ids": report.memory_ids})
    else:
        conn.execute("DELETE FROM memories WHERE id = ANY(%(memory_ids)s::uuid[])", {"memory_ids": report.memory_ids})
    for memory_id in report.memory_ids:
        write_audit(conn, actor=actor, action="forget", target_type="memory", target_id=memory_id, user_id=user_id,
                    detail={"distillations": len(by_memory.get(memory_id, [])), "soft": soft,
                            "versions_removed": report.versions_removed})
    return report
