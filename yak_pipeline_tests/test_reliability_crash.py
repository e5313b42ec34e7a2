"""Crash safety and concurrent workers (issue 6 §3 and §4, second half).

``yak process`` runs as a real subprocess against the test's database and the loopback
OpenAI-protocol server. It is SIGKILLed in the middle of a partition — once while distilling,
once while a near-duplicate merge waits for the LLM — and the database must hold no half-written
memory; the next run finishes the work. Three ``yak process`` started together must never distil
one memory twice.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from yak_loopback.openai_replies import Reply, rules_replier
from yak_loopback.openai_server import FakeOpenAIServer
from yak_pipeline.llm.prompts import parse_payload
from yak_pipeline.store.database import Database
from yak_pipeline_tests.pipeline_helpers import DAY, NEXT_DAY, add_exchange
from yak_pipeline_tests.reliability_helpers import (
    PipelineState,
    add_facts,
    kill_hard,
    pipeline_state,
    report_figure,
    start_yak_process,
    wait_until,
    yak_env,
)

pytestmark = pytest.mark.slow


class SlowTasks:
    """Answers like a good model, after ``delays[task]`` seconds; records the exchanges it distilled."""

    def __init__(self, **delays: float) -> None:
        self.delays = delays
        self.tasks: Counter[str] = Counter()
        self.distilled: Counter[str] = Counter()

    def __call__(self, request: dict[str, Any]) -> Reply:
        task, payload = parse_payload(request["messages"][-1]["content"])
        self.tasks[task] += 1
        if task == "distil":
            self.distilled[payload["exchange"]] += 1
        time.sleep(self.delays.get(task, 0.0))
        return rules_replier(request)


def _state(db_url: str) -> PipelineState:
    with psycopg.connect(db_url) as conn:
        return pipeline_state(conn)


def _env(db_url: str, tmp_path: Path, server: FakeOpenAIServer, concurrency: int = 2) -> dict[str, str]:
    return yak_env(db_url, tmp_path / "home", YAK_LLM_BASE_URL=server.base_url, YAK_LLM_MODEL="fake-model",
                   YAK_LLM_MAX_RETRIES="0", YAK_LLM_TIMEOUT_SECONDS="30", YAK_LLM_CONCURRENCY=str(concurrency),
                   YAK_DROP_DIR=str(tmp_path / "drop"))


def _finish(process, log: Path) -> dict:  # noqa: ANN001
    assert process.wait(timeout=300) == 0, log.read_text()[-3000:]
    return json.loads(log.read_text().strip().splitlines()[-1])


def test_a_worker_killed_mid_partition_leaves_nothing_half_written_and_the_next_run_finishes(
        db_url: str, database: Database, tmp_path: Path) -> None:
    facts, pairs = 24, 4
    add_facts(database, facts)
    for i in range(pairs):  # near-duplicates: the same fact twice, a merge for the pipeline to do
        add_exchange(database, "alice", f"My cousin number {i} is called {'Ana Bea Cleo Dora'.split()[i]}.", DAY,
                     minute=50 + i)
        add_exchange(database, "alice", f"My cousin number {i} is called {'Ana Bea Cleo Dora'.split()[i]}.", DAY,
                     minute=55 + i, assistant="Lovely name!")
    total = facts + 2 * pairs
    replier = SlowTasks(distil=0.2, consolidate=1.5)
    with FakeOpenAIServer(replier) as server:
        env = _env(db_url, tmp_path, server)

        # Kill 1: while distilling.
        process, log = start_yak_process(env, tmp_path, "kill-1")
        wait_until(lambda: _state(db_url).distillations >= 4 or process.poll() is not None, timeout=120,
                   what="distillations to be committed")
        kill_hard(process)
        after_first = _state(db_url)
        assert after_first.violations == []
        assert 4 <= after_first.distillations < total and after_first.distilled == after_first.distillations

        # Kill 2: while a near-duplicate merge waits for the LLM's consolidated text.
        process, log = start_yak_process(env, tmp_path, "kill-2")
        wait_until(lambda: replier.tasks["consolidate"] >= 1 or process.poll() is not None, timeout=180,
                   what="a consolidation request")
        assert process.poll() is None, log.read_text()[-3000:]
        kill_hard(process)
        after_second = _state(db_url)
        assert after_second.violations == []
        assert after_second.distilled == total and after_second.merged < pairs

        # The next run finishes everything, exactly once.
        replier.delays.clear()
        report = _finish(*start_yak_process(env, tmp_path, "finish"))
        assert report["failed_runs"] == 0
        done = _state(db_url)
        assert done.violations == []
        assert (done.memories, done.distilled, done.distillations, done.merged) == (total, total, total, pairs)
        assert done.versions == total + pairs  # one first version each, one merge version per pair
        # Only a call in flight when a worker was killed is ever repeated (2 workers: at most 2).
        repeated = sum(c - 1 for c in replier.distilled.values())
        assert len(replier.distilled) == total and repeated <= 2
        quiet = _finish(*start_yak_process(env, tmp_path, "again"))
        assert quiet["partitions"] == []
    report_figure("SIGKILL mid-partition", f"killed while distilling ({after_first.distillations} of {total} "
                  f"committed) and while merging ({after_second.merged} of {pairs} merges committed): 0 half-written "
                  f"rows; the next run finished {total} memories, {pairs} merges, 0 duplicates "
                  f"({repeated} LLM calls in flight at a kill were repeated)")


def test_concurrent_yak_process_runs_never_distil_a_memory_twice(db_url: str, database: Database,
                                                                tmp_path: Path) -> None:
    per_user, workers = 30, 3
    add_facts(database, per_user, user_id="alice")
    add_facts(database, per_user, user_id="bob", day=NEXT_DAY, start=per_user)
    replier = SlowTasks(distil=0.05)
    with FakeOpenAIServer(replier) as server:
        env = _env(db_url, tmp_path, server, concurrency=4)
        started = [start_yak_process(env, tmp_path, f"worker-{k}") for k in range(workers)]
        reports = [_finish(*pair) for pair in started]

    assert all(r["failed_runs"] == 0 for r in reports)
    distilled_by = [r["assets"].get("distillations", {}).get("rows_out", 0) for r in reports]
    assert sum(distilled_by) == 2 * per_user  # the work was shared out, none of it done twice
    assert replier.tasks["distil"] == 2 * per_user and max(replier.distilled.values()) == 1
    state = _state(db_url)
    assert state.violations == []
    assert (state.memories, state.distilled, state.distillations) == (2 * per_user,) * 3
    report_figure("Concurrent yak process", f"{workers} processes at once over {2 * per_user} memories: "
                  f"distilled {'+'.join(map(str, distilled_by))} = {sum(distilled_by)}, "
                  f"{replier.tasks['distil']} LLM distil calls, 0 memories distilled twice")
