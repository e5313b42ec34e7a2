"""Batching for ingest throughput (issue 5): same outcomes, fewer model calls.

- ``Coalescer`` merges overlapping embedding requests of several threads into one model call and
  hands every caller its own vectors (or the batch's error).
- The merge stage's look-ahead (consolidations worked out and embedded in batches ahead of their
  turn) ends in exactly the state the one-by-one loop (``lookahead=1``) ends in. Near-duplicates
  never cross users, so one database holds both runs: the same exchanges for two users, one
  merged each way, then compared row by row.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from yak_pipeline.embeddings.batching import Coalescer
from yak_pipeline.embeddings.hashing import HashingEmbedder
from yak_pipeline.ingestion.formats.exchange_records import ExchangeRecord
from yak_pipeline.ingestion.records import ingest_records
from yak_pipeline.llm.errors import LLMUnavailable
from yak_pipeline.llm.rules import RulesProvider
from yak_pipeline.services.consolidate import ConsolidateJob, merge_near_duplicates, score_conflicts
from yak_pipeline.services.distill import DistillJob, distill_memories, partition_memory_ids
from yak_pipeline.store.database import Database

# --- Coalescer ---------------------------------------------------------------------------------


class _SlowModel:
    """A stand-in model call that takes a while, records each batch, and embeds text as its length."""

    def __init__(self, seconds: float = 0.05, fail_on: str | None = None) -> None:
        self.seconds = seconds
        self.fail_on = fail_on
        self.batches: list[list[str]] = []
        self._lock = threading.Lock()

    def __call__(self, texts: list[str]) -> list[list[float]]:
        with self._lock:
            self.batches.append(list(texts))
        time.sleep(self.seconds)
        if self.fail_on is not None and self.fail_on in texts:
            raise RuntimeError(f"cannot embed {self.fail_on!r}")
        return [[float(len(t)), float(ord(t[0]))] for t in texts]


def _run_threads(coalescer: Coalescer, requests: list[list[str]]) -> list[object]:
    """Call the coalescer from one thread per request at once; each thread's result or exception."""
    results: list[object] = [None] * len(requests)
    start = threading.Barrier(len(requests))

    def call(index: int) -> None:
        start.wait()
        try:
            results[index] = coalescer(requests[index])
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            results[index] = exc

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    return results


def test_a_lone_call_is_one_model_call_with_its_vectors_in_order() -> None:
    model = _SlowModel(seconds=0)
    coalescer = Coalescer(model)
    assert coalescer(["a", "bb", "ccc"]) == [[1.0, 97.0], [2.0, 98.0], [3.0, 99.0]]
    assert coalescer([]) == []
    assert model.batches == [["a", "bb", "ccc"]]


def test_overlapping_calls_share_model_calls_and_each_gets_its_own_vectors() -> None:
    model = _SlowModel(seconds=0.05)
    coalescer = Coalescer(model)
    requests = [[f"{chr(97 + i)}{'x' * i}", f"{chr(65 + i)}{'y' * (2 * i)}"] for i in range(12)]
    results = _run_threads(coalescer, requests)
    for request, vectors in zip(requests, results):
        assert vectors == [[float(len(t)), float(ord(t[0]))] for t in request]
    # The first caller runs alone; the others queue meanwhile and go together, in far fewer calls.
    assert len(model.batches) < len(requests) / 2
    assert sorted(t for batch in model.batches for t in batch) == sorted(t for r in requests for t in r)


def test_a_batch_never_exceeds_max_texts_unless_one_request_does() -> None:
    model = _SlowModel(seconds=0.02)
    coalescer = Coalescer(model, max_texts=4)
    requests = [["a", "b", "c"] for _ in range(6)] + [["d"] * 9]
    results = _run_threads(coalescer, requests)
    assert all(isinstance(r, list) for r in results)
    assert all(len(batch) <= 4 or batch == ["d"] * 9 for batch in model.batches)


def test_a_failed_batch_fails_every_caller_in_it_and_the_next_batch_still_runs() -> None:
    model = _SlowModel(seconds=0.05, fail_on="boom")
    coalescer = Coalescer(model)
    results = _run_threads(coalescer, [["boom"]] + [["fine"]] * 5)
    failed = [r for r in results if isinstance(r, RuntimeError)]
    assert failed, "the caller whose text fails must see the error"
    assert all(r == [[4.0, 102.0]] for r in results if not isinstance(r, Exception))
    # Callers that shared the failing batch failed with it; the coalescer keeps working afterwards.
    assert coalescer(["ok"]) == [[2.0, 111.0]]


# --- Merge look-ahead ---------------------------------------------------------------------------

_FACTS = ["moved to Lisbon", "adopted a kitten called Miso", "started learning the violin", "work as a nurse",
          "bake sourdough on Sundays", "prefer green tea"]


def _records(user_id: str, n: int) -> list[ExchangeRecord]:
    """Exchanges repeating a few facts in varying pairs, so near-duplicates chain up."""
    start = datetime.now(UTC) - timedelta(days=3)
    return [ExchangeRecord(user_id=user_id,
                           content=f"User: I {_FACTS[i % 6]}, and I {_FACTS[(i * 5 + 1) % 6]} ({i % 17}).\nAssistant: Nice!",
                           occurred_at=start + timedelta(minutes=7 * i), line=i)
            for i in range(n)]


def _state(database: Database, user_id: str) -> list[tuple]:
    """A user's distillations and versions in a user-independent form, in exchange order."""
    with database.connection() as conn:
        rows = conn.execute(
            """SELECT d.id::text, m.content, d.status, d.content, d.needs_review, d.embedding::text,
                      (SELECT array_agg(v.content || ' <- ' || coalesce(array_to_string(v.merged_from, ','), '')
                                        ORDER BY v.version)
                       FROM distillation_versions v WHERE v.distillation_id = d.id)
               FROM distillations d JOIN memories m ON m.id = d.memory_id
               WHERE d.user_id = %s ORDER BY m.occurred_at""",
            (user_id,),
        ).fetchall()
    # Versions name merged distillations by id; name them by exchange position instead.
    position = {row[0]: str(i) for i, row in enumerate(rows)}
    state = []
    for _, exchange, status, content, review, embedding, versions in rows:
        named = []
        for version in versions:
            text, _, merged = version.rpartition(" <- ")
            named.append((text, tuple(position[m] for m in merged.split(",") if m)))
        state.append((exchange, status, content, review, embedding, tuple(named)))
    return state


class _CountingRules(RulesProvider):
    """The rules provider, counting consolidation calls (thread-safe)."""

    def __init__(self) -> None:
        self.consolidations = 0
        self._lock = threading.Lock()

    def consolidate(self, older: str, newer: str):  # noqa: ANN201 - as the parent
        with self._lock:
            self.consolidations += 1
        return super().consolidate(older, newer)


def _prepare(database: Database, llm: RulesProvider, embedder: HashingEmbedder, user_id: str, n: int) -> None:
    ingest_records(database, _records(user_id, n), source="import")
    job = DistillJob(db=database, llm=llm, embedder=embedder, prompt_version="test")
    ids = partition_memory_ids(database, user_id=user_id, day=None, include_outdated=False, prompt_version="test")
    # One at a time: creation order decides merge order, and it must be the same for both users.
    assert distill_memories(job, ids, concurrency=1).rows_out == n
    score_conflicts(ConsolidateJob(db=database, llm=llm, embedder=embedder), user_id=user_id, day=None)


@pytest.mark.parametrize("lookahead, concurrency", [(32, 1), (5, 3)])
def test_merge_look_ahead_ends_in_the_one_by_one_state(database: Database, lookahead: int, concurrency: int) -> None:
    embedder = HashingEmbedder(384)
    n = 60
    for user in ("one-by-one", "ahead"):
        _prepare(database, RulesProvider(), embedder, user, n)
    plain = merge_near_duplicates(ConsolidateJob(db=database, llm=RulesProvider(), embedder=embedder, lookahead=1),
                                  user_id="one-by-one", day=None)
    counting = _CountingRules()
    ahead = merge_near_duplicates(ConsolidateJob(db=database, llm=counting, embedder=embedder, lookahead=lookahead,
                                                 concurrency=concurrency), user_id="ahead", day=None)
    assert plain.flagged > 5, "the data must produce merges for the comparison to mean anything"
    assert _state(database, "ahead") == _state(database, "one-by-one")
    assert (ahead.rows_in, ahead.rows_out, ahead.flagged, ahead.failed, ahead.skipped) == (
        plain.rows_in, plain.rows_out, plain.flagged, plain.failed, plain.skipped)
    # Every merge consolidated once, plus look-aheads that went stale and were redone at their turn.
    assert counting.consolidations >= ahead.flagged
    assert len(ahead.latencies_ms) == counting.consolidations


class _CountingEmbedder(HashingEmbedder):
    """The hashing embedder, counting its document calls."""

    def __init__(self) -> None:
        super().__init__(384)
        self.calls: list[int] = []

    def embed_documents(self, texts):  # noqa: ANN001, ANN201 - as the parent
        self.calls.append(len(texts))
        return super().embed_documents(texts)


def test_a_chain_of_merges_into_one_survivor_is_embedded_in_one_call(database: Database) -> None:
    """Merges into the same survivor, each reading the text the one before leaves, are worked out
    ahead together (speculatively, checked at each turn): far fewer embedding calls than merges."""
    _prepare(database, RulesProvider(), HashingEmbedder(384), "chain", 60)
    embedder = _CountingEmbedder()
    report = merge_near_duplicates(ConsolidateJob(db=database, llm=RulesProvider(), embedder=embedder),
                                   user_id="chain", day=None)
    assert report.flagged > 10, "the data must chain merges for the comparison to mean anything"
    # One call per look-ahead (each of many merges), plus the few merges a stale look-ahead left to their turn.
    # Stopping at the first merge touching an earlier one's distillations made 9 calls of 3-5 texts here.
    assert len(embedder.calls) * 6 <= report.flagged, embedder.calls


class _FailingConsolidation(RulesProvider):
    """Rules, except that consolidating fails (as an unreachable LLM would), counting the attempts."""

    def __init__(self) -> None:
        self.attempts = 0

    def consolidate(self, older: str, newer: str):  # noqa: ANN201 - as the parent
        self.attempts += 1
        raise LLMUnavailable("connection refused")


def test_a_failed_look_ahead_consolidation_fails_that_merge_once_and_leaves_it_unchecked(database: Database) -> None:
    embedder = HashingEmbedder(384)
    _prepare(database, RulesProvider(), embedder, "flaky", 30)
    llm = _FailingConsolidation()
    report = merge_near_duplicates(ConsolidateJob(db=database, llm=llm, embedder=embedder), user_id="flaky", day=None)
    assert report.failed > 0 and report.flagged == 0
    assert llm.attempts == report.failed  # the look-ahead's failure is the merge's failure, not retried at once
    with database.connection() as conn:
        unchecked = conn.execute(
            """SELECT count(*) FROM distillations
               WHERE user_id = 'flaky' AND status = 'active' AND dedup_checked_at IS NULL""").fetchone()[0]
        merged = conn.execute("SELECT count(*) FROM distillations WHERE status = 'merged'").fetchone()[0]
    assert unchecked >= report.failed and merged == 0


def test_a_stale_look_ahead_is_never_used(database: Database) -> None:
    """A look-ahead worked out on texts that have changed since is redone at the merge's turn."""
    from yak_pipeline.llm.models import ConsolidationResult, LLMCallStats
    from yak_pipeline.services.consolidate import _merge_one, _unchecked
    from yak_pipeline.services.merge_lookahead import Foresight

    embedder = HashingEmbedder(384)
    _prepare(database, RulesProvider(), embedder, "stale", 30)
    job = ConsolidateJob(db=database, llm=RulesProvider(), embedder=embedder)
    stats = LLMCallStats(latency_ms=1.0, prompt_tokens=None, completion_tokens=None, attempts=1)
    report = type(merge_near_duplicates(job, user_id="nobody", day=None))()
    for distillation_id in _unchecked(database, user_id="stale", day=None, column="dedup_checked_at",
                                      require="conflict_checked_at"):
        # As if worked out before an earlier merge changed the older text.
        stale = Foresight(inputs=("x", "older text then", "y", "newer text then"),
                           merged=ConsolidationResult(content="A stale consolidation.", stats=stats),
                           vector=embedder.embed_query("A stale consolidation."))
        _merge_one(job, distillation_id, stale, report)
    assert report.flagged > 0
    with database.connection() as conn:
        used = conn.execute("""SELECT count(*) FROM distillation_versions
                               WHERE content = 'A stale consolidation.'""").fetchone()[0]
    assert used == 0


def test_up_to_max_parallel_batches_run_at_once_and_every_caller_is_answered() -> None:
    running, most = 0, 0
    lock = threading.Lock()

    def model(texts: list[str]) -> list[list[float]]:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.05)
        with lock:
            running -= 1
        return [[float(len(t))] for t in texts]

    coalescer = Coalescer(model, max_parallel=2)
    requests = [["x" * (i + 1)] for i in range(10)]
    results = _run_threads(coalescer, requests)
    assert results == [[[float(i + 1)]] for i in range(10)]
    assert most == 2


# --- Distillation workers and LLM slots ---------------------------------------------------------


class _Busy:
    """Workers in an LLM call and workers embedding their distillation, now and at most."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calling = self.embedding = self.most_calling = self.most_busy = 0

    def enter(self, what: str) -> None:
        with self.lock:
            setattr(self, what, getattr(self, what) + 1)
            self.most_calling = max(self.most_calling, self.calling)
            self.most_busy = max(self.most_busy, self.calling + self.embedding)

    def leave(self, what: str) -> None:
        with self.lock:
            setattr(self, what, getattr(self, what) - 1)


class _SlowRules(RulesProvider):
    """Rules, answering after 50 ms."""

    def __init__(self, busy: _Busy) -> None:
        self.busy = busy

    def distill(self, content: str):  # noqa: ANN201 - as the parent
        self.busy.enter("calling")
        time.sleep(0.05)
        self.busy.leave("calling")
        return super().distill(content)


class _SlowDistillationEmbedder(HashingEmbedder):
    """Hashing vectors; a worker's embedding of its distillation (after the answer) takes 100 ms."""

    def __init__(self, busy: _Busy) -> None:
        super().__init__(384)
        self.busy = busy

    def embed_documents(self, texts):  # noqa: ANN001, ANN201 - as the parent
        if not threading.current_thread().name.startswith("yak-distil_"):  # the early embedding
            return super().embed_documents(texts)
        self.busy.enter("embedding")
        time.sleep(0.1)
        self.busy.leave("embedding")
        return super().embed_documents(texts)


@pytest.mark.parametrize("connections, fifth_worker", [(6, True), (4, False)])
def test_a_worker_embedding_its_distillation_holds_no_llm_slot_and_calls_never_exceed_the_concurrency(
        database: Database, db_url: str, connections: int, fifth_worker: bool) -> None:
    ingest_records(database, _records("slots", 24), source="import")
    busy = _Busy()
    with Database(db_url, max_size=connections) as pool:
        job = DistillJob(db=pool, llm=_SlowRules(busy), embedder=_SlowDistillationEmbedder(busy), prompt_version="test")
        ids = partition_memory_ids(pool, user_id="slots", day=None, include_outdated=False, prompt_version="test")
        assert distill_memories(job, ids, concurrency=4).rows_out == 24
    assert busy.most_calling <= 4
    if fifth_worker:
        # A fifth worker called the LLM in a slot given back by a worker still embedding its distillation.
        assert busy.most_busy == 5
    else:
        # No connection to spare for a fifth worker: none waits for one while holding a slot.
        assert busy.most_busy <= 4


# --- Conflict checks side by side ------------------------------------------------------------------

_CHANGING = ["I live in Lisbon", "I live in Porto", "I work as a nurse", "I work as a teacher",
             "My favourite colour is blue", "My favourite colour is green", "I am vegetarian", "I eat fish"]


def _distilled(database: Database, user_id: str, n: int, facts: list[str] = _CHANGING) -> None:
    """``n`` exchanges of ``facts`` (by default facts that keep changing), distilled one at a time and
    not yet conflict-checked."""
    start = datetime.now(UTC) - timedelta(days=3)
    records = [ExchangeRecord(user_id=user_id, content=f"User: {facts[(i * 3) % len(facts)]} ({i}).\nAssistant: Noted.",
                              occurred_at=start + timedelta(minutes=5 * i), line=i) for i in range(n)]
    ingest_records(database, records, source="import")
    job = DistillJob(db=database, llm=RulesProvider(), embedder=HashingEmbedder(384), prompt_version="test")
    ids = partition_memory_ids(database, user_id=user_id, day=None, include_outdated=False, prompt_version="test")
    assert distill_memories(job, ids, concurrency=1).rows_out == n


def _conflict_state(database: Database, user_id: str) -> tuple[list, list]:
    """A user's conflicts (as exchange positions) and each distillation's check and review marks."""
    with database.connection() as conn:
        rows = conn.execute(
            """SELECT d.id::text, d.conflict_checked_at IS NOT NULL, d.needs_review, d.superseded_by IS NOT NULL
               FROM distillations d JOIN memories m ON m.id = d.memory_id WHERE d.user_id = %s
               ORDER BY m.occurred_at""", (user_id,)).fetchall()
        pairs = conn.execute("SELECT distillation_a::text, distillation_b::text FROM conflicts WHERE user_id = %s",
                             (user_id,)).fetchall()
    position = {row[0]: i for i, row in enumerate(rows)}
    return sorted(tuple(sorted((position[a], position[b]))) for a, b in pairs), [row[1:] for row in rows]


def test_conflicts_checked_side_by_side_end_in_the_one_at_a_time_state(database: Database) -> None:
    """Contradicting distillations checked by several workers at once (each records the pair and
    flags the other side) give the same conflicts, marks and counts as one check after another."""
    n = 40
    for user in ("one-at-a-time", "side-by-side"):
        _distilled(database, user, n)
    embedder = HashingEmbedder(384)
    plain = score_conflicts(ConsolidateJob(db=database, llm=RulesProvider(), embedder=embedder),
                            user_id="one-at-a-time", day=None)
    wide = score_conflicts(ConsolidateJob(db=database, llm=RulesProvider(), embedder=embedder, concurrency=4),
                           user_id="side-by-side", day=None)
    assert plain.flagged >= 3, "the data must produce conflicts for the comparison to mean anything"
    assert _conflict_state(database, "side-by-side") == _conflict_state(database, "one-at-a-time")
    assert (wide.rows_in, wide.rows_out, wide.flagged, wide.failed, wide.skipped) == (
        plain.rows_in, plain.rows_out, plain.flagged, plain.failed, plain.skipped) == (n, n, plain.flagged, 0, 0)


def test_a_distillation_held_elsewhere_is_skipped_once_and_left_for_the_next_run(database: Database) -> None:
    # Facts that contradict nothing: no check needs the held row (recording a conflict would wait for it).
    _distilled(database, "held", 12, [f"I have a pet called {name}" for name in ("Miso", "Tofu", "Pip", "Luna")] + _FACTS)
    with database.connection() as conn:
        active = conn.execute("SELECT count(*) FROM distillations WHERE user_id = 'held' AND status = 'active'"
                              ).fetchone()[0]
    with database.connection() as holder:
        held = holder.execute("SELECT id::text FROM distillations WHERE user_id = 'held' AND status = 'active' ORDER BY created_at LIMIT 1"
                              ).fetchone()[0]
        holder.execute("SELECT 1 FROM distillations WHERE id = %s FOR UPDATE", (held,))
        report = score_conflicts(ConsolidateJob(db=database, llm=RulesProvider(), embedder=HashingEmbedder(384),
                                                concurrency=4), user_id="held", day=None)
    assert active > 5 and (report.rows_in, report.rows_out, report.skipped) == (active, active - 1, 1)
    with database.connection() as conn:
        unchecked = conn.execute("SELECT id::text FROM distillations WHERE user_id = 'held' AND status = 'active' AND conflict_checked_at IS NULL"
                                 ).fetchall()
    assert unchecked == [(held,)]


class _MeetingRules(RulesProvider):
    """Rules, except that the first two conflict calls wait for each other: two checks then hold
    their own rows when each records the pair, and PostgreSQL must end the deadlock."""

    def __init__(self) -> None:
        self._meeting = threading.Barrier(2, timeout=10)
        self.calls = 0
        self._lock = threading.Lock()

    def conflict_score(self, a: str, b: str):  # noqa: ANN201 - as the parent
        with self._lock:
            self.calls += 1
            meet = self.calls <= 2
        if meet:
            self._meeting.wait()
        return super().conflict_score(a, b)


def test_two_contradicting_distillations_checked_at_once_record_their_conflict_once(database: Database) -> None:
    """Each check locks its own distillation and records the pair, which updates the other's row:
    a deadlock, which PostgreSQL ends by failing one of them. That check is undone and done again
    after the other, and the outcome is the one-at-a-time outcome."""
    _distilled(database, "meeting", 2, ["I live in Lisbon", "I live in Porto"])
    llm = _MeetingRules()
    report = score_conflicts(ConsolidateJob(db=database, llm=llm, embedder=HashingEmbedder(384), concurrency=2),
                             user_id="meeting", day=None)
    assert llm.calls == 3  # both checks once, and the undone one again
    assert (report.rows_in, report.rows_out, report.flagged, report.failed, report.skipped) == (2, 2, 1, 0, 0)
    pairs, marks = _conflict_state(database, "meeting")
    assert pairs == [(0, 1)]
    # Both checked, both flagged for review, the one said first superseded by the other.
    assert marks == [(True, True, True), (True, True, False)]
