"""Load (issue 6 §4): 20 clients × 100 ``POST /api/memories/`` against a live ``yak serve``, with
searches, context requests and turns running at the same time.

Exactly 2,000 memories must be stored once each, no request may get a 5xx, and posting the same
2,000 again must add nothing. Turns repeat some of the very exchanges being posted, so the
content-hash uniqueness is raced for real. Latencies are measured and reported.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest

from yak_pipeline.store.database import Database
from yak_pipeline_tests.reliability_helpers import report_figure, yak_env, yak_serve
from yak_pipeline_tests.store_helpers import seed_memory_with_distillation

pytestmark = pytest.mark.slow

CLIENTS, POSTS = 20, 100
ADMIN_KEY = "load-admin-key-0123456789abcdef"


def _exchange(client: int, i: int) -> tuple[str, str]:
    return f"Load client {client} says fact {i}: my item {client}-{i} is in drawer {i % 7}.", f"Noted ({client}-{i})."


class Recorder:
    """Status codes and latencies per kind of request, from every thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.statuses: dict[str, Counter[int]] = defaultdict(Counter)
        self.latencies: dict[str, list[float]] = defaultdict(list)

    def call(self, kind: str, client: httpx.Client, path: str, body: dict) -> httpx.Response:
        started = time.perf_counter()
        response = client.post(path, json=body)
        elapsed = (time.perf_counter() - started) * 1000
        with self.lock:
            self.statuses[kind][response.status_code] += 1
            self.latencies[kind].append(elapsed)
        return response

    def percentile(self, kind: str, q: float) -> float:
        return float(np.percentile(self.latencies[kind], q))

    def server_errors(self) -> dict[str, int]:
        return {kind: sum(n for code, n in counts.items() if code >= 500) for kind, counts in self.statuses.items()}


def test_twenty_clients_post_two_thousand_memories_with_searches_and_turns(
        db_url: str, database: Database, tmp_path: Path) -> None:
    with database.connection() as conn:
        for i in range(30):  # something for the searches to find
            seed_memory_with_distillation(conn, user_id="searcher", exchange=f"User: I own {i} bikes.\nAssistant: ok",
                                          distillation=f"The user owns {i} bikes of brand {i * 3}.")
    recorder = Recorder()
    posting_done = threading.Event()
    env = yak_env(db_url, tmp_path / "home", YAK_ADMIN_API_KEY=ADMIN_KEY)
    with yak_serve(env, tmp_path) as server:
        def new_client() -> httpx.Client:
            return httpx.Client(base_url=server.url, headers={"X-API-Key": ADMIN_KEY}, timeout=60)

        def poster(client_no: int, kind: str) -> None:
            with new_client() as client:
                for i in range(POSTS):
                    user, assistant = _exchange(client_no, i)
                    recorder.call(kind, client, "/api/memories/", {
                        "user_id": f"load-{client_no}", "content": f"User: {user}\nAssistant: {assistant}"})

        def searcher(k: int) -> None:
            with new_client() as client:
                n = 0
                while not posting_done.is_set() and n < 2000:
                    query = f"how many bikes of brand {n % 30} do I own"
                    recorder.call("search", client, "/api/distillations/search",
                                  {"user_id": "searcher", "query": query, "threshold": 0.3, "limit": 5})
                    recorder.call("context", client, "/api/context", {"user_id": f"load-{(k + n) % CLIENTS}",
                                                                       "query": f"drawer {n % 7}", "threshold": 0.3})
                    n += 1

        turned: set[tuple[int, int]] = set()

        def turner(k: int) -> None:
            with new_client() as client:
                for j in range(60):
                    client_no, i = (k * 7 + j) % CLIENTS, (j * 13 + k) % POSTS
                    user, assistant = _exchange(client_no, i)
                    recorder.call("turn", client, "/api/turns", {"user_id": f"load-{client_no}", "user_message": user,
                                                                 "assistant_message": assistant})
                    with recorder.lock:
                        turned.add((client_no, i))

        started = time.monotonic()
        with ThreadPoolExecutor(CLIENTS + 6) as pool:
            background = [pool.submit(searcher, k) for k in range(3)] + [pool.submit(turner, k) for k in range(3)]
            posters = [pool.submit(poster, c, "post") for c in range(CLIENTS)]
            for f in posters:
                f.result(timeout=600)
            posting_done.set()
            for f in background:
                f.result(timeout=600)
        first_pass = time.monotonic() - started

        with database.connection() as conn:
            memories = conn.execute("SELECT count(*), count(DISTINCT content_sha256) FROM memories "
                                    "WHERE user_id LIKE 'load-%%'").fetchone()
            ingests = conn.execute("SELECT count(*) FROM audit_log WHERE action = 'ingest' "
                                   "AND user_id LIKE 'load-%%'").fetchone()[0]
            turns = conn.execute("SELECT count(*), count(DISTINCT memory_id) FROM turns").fetchone()

        # Every client posts its 100 again: nothing new.
        with ThreadPoolExecutor(CLIENTS) as pool:
            for f in [pool.submit(poster, c, "repost") for c in range(CLIENTS)]:
                f.result(timeout=600)
        with database.connection() as conn:
            after = conn.execute("SELECT count(*) FROM memories WHERE user_id LIKE 'load-%%'").fetchone()[0]
            ingests_after = conn.execute("SELECT count(*) FROM audit_log WHERE action = 'ingest' "
                                         "AND user_id LIKE 'load-%%'").fetchone()[0]
        logs = server.logs()

    assert recorder.server_errors() == {kind: 0 for kind in recorder.statuses}, dict(recorder.statuses)
    assert set(recorder.statuses["post"]) <= {200, 201}  # 200: a turn stored that exchange first
    assert set(recorder.statuses["turn"]) == {202} and set(recorder.statuses["search"]) == {200}
    assert set(recorder.statuses["context"]) == {200}
    assert memories == (CLIENTS * POSTS, CLIENTS * POSTS)  # exactly 2,000, each stored once
    assert ingests == CLIENTS * POSTS
    assert turns == (len(turned), len(turned))  # one turn per distinct exchange, never two
    assert recorder.statuses["repost"] == Counter({200: CLIENTS * POSTS})
    assert (after, ingests_after) == (CLIENTS * POSTS, CLIENTS * POSTS)  # re-posting adds 0 rows
    assert "Traceback" not in logs
    p95 = {kind: recorder.percentile(kind, 95) for kind in ("post", "search", "context", "turn", "repost")}
    report_figure("Load", f"{CLIENTS} clients x {POSTS} POSTs + {sum(recorder.statuses['search'].values())} searches "
                  f"+ {sum(recorder.statuses['context'].values())} context + {sum(recorder.statuses['turn'].values())} "
                  f"turns in {first_pass:.1f} s: {memories[0]} memories stored once each, 0 5xx; re-post: 0 new rows; "
                  + ", ".join(f"p95 {k} {v:.0f} ms" for k, v in p95.items())
                  + f"; p50 post {recorder.percentile('post', 50):.0f} ms")
