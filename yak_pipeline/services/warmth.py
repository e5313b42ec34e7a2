"""Warmth evaluation: was a recalled memory useful for the turn? (DESIGN §4)

One function, :func:`evaluate_relevance`, serves the API's synchronous evaluation, the per-turn
``warmth`` asset and the nightly re-evaluation. Each (turn, memory) pair is evaluated once: a
pair that already has a warmth event is skipped, so re-runs never count a turn twice.

With an LLM configured, the LLM judges usefulness. Offline (the rules provider) the judge is
recall's own relevance model applied to the memory and the turn (:class:`OfflineJudge`), on its
even-odds scale (``RelevanceModel.usefulness``: recall's gate is lenient on purpose, a judgement
of use must not be), with the warmth rule's 0.7 and 0.3. The rules provider's word overlap only ever lowered warmth (a memory the
answer used scored 0.67, under 0.7).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any, Protocol
from uuid import UUID

import psycopg

from yak_pipeline.alerts import NULL_ALERTER, Alerter
from yak_pipeline.core.exchanges import format_exchange
from yak_pipeline.core.recall import RecallParams
from yak_pipeline.core.relevance import RelevanceModel, RelevanceSignals
from yak_pipeline.core.warmth import WARMTH_DEFAULT
from yak_pipeline.embeddings import Embedder
from yak_pipeline.llm.errors import LLMError
from yak_pipeline.llm.provider import LLMProvider
from yak_pipeline.llm.rules import RULES_PROVIDER_NAME
from yak_pipeline.services.recall import RecallParts, signals_for_text
from yak_pipeline.services.reports import StageReport
from yak_pipeline.store.database import Database
from yak_pipeline.store.distillations import get_distillation
from yak_pipeline.store.locking import lock_live_row
from yak_pipeline.store.turns import TurnToEvaluate, mark_turn, turn_ids
from yak_pipeline.store.warmth import (
    WarmthUpdate,
    apply_relevance,
    evaluated_distillations,
    reset_warmth,
    warmth_history,
)

MAX_TURN_ATTEMPTS = 5


@dataclass(frozen=True)
class OfflineJudge:
    """Usefulness without an LLM: the calibrated relevance of the memory to the turn (module docstring)."""

    embedder: Embedder
    model: RelevanceModel
    params: RecallParams
    # The signals of the last (user, turn text) asked about: a turn's recalled memories are judged
    # one after another against the same text, which needs embedding and searching once.
    _last: dict[tuple[str, str], dict[str, RelevanceSignals]] = field(default_factory=dict, repr=False)

    def usefulness(self, conn: psycopg.Connection, *, user_id: str, distillation_id: str, context: str) -> float:
        """The memory's relevance to the turn's text on the even-odds scale (0 when no leg proposes it)."""
        key = (user_id, context)
        if key not in self._last:
            self._last.clear()
            self._last[key] = signals_for_text(conn, self.embedder, user_id=user_id, text=context, params=self.params)
        signals = self._last[key].get(distillation_id)
        return 0.0 if signals is None else self.model.usefulness(signals)


class JudgeParts(RecallParts, Protocol):
    """What the offline judge is made of (:class:`yak_pipeline.wiring.YakParts` is one): recall's parts and the LLM."""

    @property
    def llm(self) -> LLMProvider: ...  # noqa: D102


def offline_judge(parts: JudgeParts) -> OfflineJudge | None:
    """The judge to use with ``parts.llm``: calibrated relevance when it is the offline rules provider, else None."""
    if parts.llm.name != RULES_PROVIDER_NAME:
        return None
    # Whether *this* memory was used is about its own words: read in its conversation, a memory
    # would share the credit of the neighbour the answer did use (the context features then
    # read the exchange alone, their designed stand-in).
    return OfflineJudge(embedder=parts.embedder, model=parts.relevance_model,
                        params=replace(parts.recall_params(), exchange_context=False))


def evaluate_relevance(
    conn: psycopg.Connection,
    llm: LLMProvider,
    *,
    distillation_id: str,
    context: str,
    reason: str,
    evaluator: str | None = None,
    turn_id: str | None = None,
    user_id: str | None = None,
    report: StageReport | None = None,
    judge: OfflineJudge | None = None,
) -> WarmthUpdate | None:
    """Score one memory's usefulness for ``context`` and apply the warmth rule; None if not found.

    ``judge`` (offline) scores by calibrated relevance instead of asking ``llm``. Raises
    :class:`~yak_pipeline.llm.errors.LLMError` when the evaluator cannot answer.
    """
    distillation = get_distillation(conn, distillation_id, user_id=user_id)
    if distillation is None:
        return None
    if judge is not None:
        score = judge.usefulness(conn, user_id=distillation["user_id"], distillation_id=str(distillation_id),
                                 context=context)
        name = f"calibrated-relevance ({judge.model.version})"
    else:
        result = llm.relevance_score(distillation["content"], context)
        if report is not None:
            report.record_call(result.stats)
        score, name = result.score, llm.name
    return apply_relevance(conn, distillation_id, relevance_score=score, reason=reason, turn_id=turn_id,
                           evaluator=evaluator or name, user_id=distillation["user_id"])


@dataclass(frozen=True)
class WarmthJob:
    """What a warmth run needs."""

    db: Database
    llm: LLMProvider
    alerter: Alerter = NULL_ALERTER
    # Offline: calibrated relevance stands in for the LLM's judgement (see offline_judge).
    judge: OfflineJudge | None = None


def _turn_ids(db: Database, *, user_id: str | None, day: date | None, since: datetime | None, pending_only: bool) -> list[str]:
    with db.connection() as conn:
        return turn_ids(conn, user_id=user_id, day=day, since=since, pending_only=pending_only)


def evaluate_turn(job: WarmthJob, turn_id: str, *, reason: str) -> StageReport:
    """Evaluate every recalled memory of one turn that has no warmth event for it yet."""
    report = StageReport(rows_in=1)
    with job.db.connection() as conn:
        turn = lock_live_row(conn, "turns", turn_id, TurnToEvaluate)
        if turn is None:
            report.skipped += 1
            return report
        user_id, user_message, assistant_message = turn.user_id, turn.user_message, turn.assistant_message
        recalled, attempts = turn.recalled_ids, turn.attempts
        done = evaluated_distillations(conn, turn_id)
        context = format_exchange(user_message, assistant_message)
        try:
            for distillation_id in [str(r) for r in recalled if str(r) not in done]:
                update = evaluate_relevance(conn, job.llm, distillation_id=distillation_id, context=context,
                                            reason=reason, turn_id=turn_id, user_id=user_id, report=report,
                                            judge=job.judge)
                if update is not None and update.change.delta != 0:
                    report.flagged += 1
        except LLMError as exc:
            # Events written so far stay (each pair counts once); the rest waits for the next run.
            report.record_failed_call(exc)
            status = "failed" if attempts + 1 >= MAX_TURN_ATTEMPTS else "pending"
            mark_turn(conn, turn_id, status=status, error=exc.reason)
            report.failed += 1
            report.errors.append(f"{turn_id}: {exc.reason}")
            job.alerter.alert("warmth_failed", f"evaluating turn {turn_id} failed", ids=(turn_id,), error=exc.reason,
                              retry=(attempts + 1, MAX_TURN_ATTEMPTS))
            return report
        mark_turn(conn, turn_id, status="evaluated")
    report.rows_out += 1
    return report


def evaluate_pending_turns(job: WarmthJob, *, user_id: str | None, day: date | None) -> StageReport:
    """Evaluate the pending turns of a partition (the per-turn ``warmth`` asset)."""
    total = StageReport()
    for turn_id in _turn_ids(job.db, user_id=user_id, day=day, since=None, pending_only=True):
        total.merge(evaluate_turn(job, turn_id, reason="turn"))
    return total


def reevaluate_recent(job: WarmthJob, *, user_id: str | None, day: date | None, days: int = 7,
                      now: datetime | None = None) -> StageReport:
    """The nightly pass: every turn of the last ``days`` days, including failed ones.

    It catches up on recalled memories that were never evaluated for their turn (a failed or
    interrupted evaluation, a turn posted while the daemon was down); pairs already evaluated
    are left alone, so running it twice changes nothing.
    """
    since = (now or datetime.now(UTC)) - timedelta(days=days)
    total = StageReport()
    for turn_id in _turn_ids(job.db, user_id=user_id, day=day, since=since, pending_only=False):
        total.merge(evaluate_turn(job, turn_id, reason="nightly"))
    return total


def evaluate_now(db: Database, llm: LLMProvider, *, distillation_id: str, context: str, evaluator: str | None,
                 user_id: str | None, judge: OfflineJudge | None) -> WarmthUpdate | None:
    """A person's (or client's) manual evaluation: :func:`evaluate_relevance` in its own transaction."""
    with db.connection() as conn:
        return evaluate_relevance(conn, llm, distillation_id=distillation_id, context=context, reason="manual",
                                  evaluator=evaluator, user_id=user_id, judge=judge)


def reset_warmth_of(db: Database, distillation_ids: Sequence[str] | None, *, user_id: str, actor: str) -> int:
    """Reset warmth to the default for the user's distillations (all, or the listed ones); how many changed."""
    with db.connection() as conn:
        return reset_warmth(conn, distillation_ids, user_id=user_id, actor=actor)


def warmth_of(db: Database, distillation_id: UUID | str, *, user_id: str | None, limit: int = 50,
              reset: bool = False, actor: str = "system") -> tuple[float, list[dict[str, Any]]] | None:
    """A distillation's warmth and its latest events, newest first; None when not found (for ``user_id``).

    With ``reset`` its warmth goes back to the default first (recorded as an event).
    """
    with db.connection() as conn:
        row = get_distillation(conn, distillation_id, user_id=user_id)
        if row is None:
            return None
        warmth = row["warmth"]
        if reset:
            reset_warmth(conn, [str(distillation_id)], user_id=row["user_id"], actor=actor)
            warmth = WARMTH_DEFAULT
        return warmth, warmth_history(conn, distillation_id, limit=limit)
