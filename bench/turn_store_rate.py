"""How many proxied turns a ``yak proxy`` process stores a second, vectors included (issue 34).

``python bench/turn_store_rate.py [--n 10000] [--users 10] [--turns 200] [--clients 4] [--recall] [--json]``

Loads N memories over U users into a scratch database (``recall_latency.load``, synthetic corpus,
with the per-user indexes of ``recall_latency.build_user_indexes``), starts ``yak proxy`` as a real
process (local all-MiniLM-L6-v2 embedder, recall switched off unless ``--recall``, so the chats
themselves take little of the two cores) in front of the tests' loopback OpenAI-protocol upstream,
which answers at once. Then:

1. **first turn**: one chat ``--first-chat-after`` seconds after ``/health`` answers (default 20,
   about what a person takes to send a first message), and the time from its answer until the
   database holds its exchange with its vector: the torch model for documents is loaded by the
   first store, or (since issue 34's follow-up) by the proxy's warm-up as it starts;
2. **the burst**: T chats (not streamed, over ``--clients`` threads, round the U users) sent back to
   back, fewer than ``MAX_WAITING_TURNS`` so no chat stores its own turn: how long until the
   database holds all T exchanges with their own vector (``embedding``), from the first chat sent.
   **Stores a second** = T / that time. The context vector is not waited for: a later turn of the
   same user resets an earlier one's (sql/008), and the pipeline gives it again.

Each answer carries this run's tag, so every turn is a new exchange. The 1-minute load average
is recorded: the figures are only as quiet as the machine was.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, print_table, progress, running_yak, scratch_database, write_result  # noqa: E402
from recall_latency import build_user_indexes, load  # noqa: E402

from yak_loopback.openai_replies import chat_replier  # noqa: E402
from yak_loopback.openai_server import FakeOpenAIServer  # noqa: E402
from yak_pipeline.settings import get_settings  # noqa: E402

WAIT_SECONDS = 300.0


def _stored(conn, users: list[str], since: object) -> int:  # noqa: ANN001 - a psycopg connection
    """Exchanges of ``users`` that occurred since ``since`` and have their own vector."""
    return conn.execute("""SELECT count(*) FROM memories WHERE user_id = ANY(%(users)s) AND occurred_at >= %(since)s
                             AND embedding IS NOT NULL""", {"users": users, "since": since}).fetchone()[0]


def _wait_for(conn, users: list[str], since: object, count: int) -> float:  # noqa: ANN001
    """Wait until ``count`` turns since ``since`` are stored with their vector; the monotonic time then."""
    deadline = time.monotonic() + WAIT_SECONDS
    while _stored(conn, users, since) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the proxy stored {_stored(conn, users, since)} of {count} turns in {WAIT_SECONDS:g} s")
        time.sleep(0.01)
    return time.monotonic()


def measure(url: str, users: list[str], upstream: FakeOpenAIServer, *, turns: int, clients: int,
            recall: bool, first_chat_after: float) -> dict:
    """The first turn's store lag and the burst's stores a second, through a fresh ``yak proxy`` process."""
    import httpx

    from yak_pipeline.store.database import connect

    key = secrets.token_urlsafe(24)
    env = {**os.environ, "YAK_DATABASE_URL": url, "YAK_ADMIN_API_KEY": key, "YAK_UPSTREAM_BASE_URL": upstream.base_url,
           "YAK_EMBEDDER": "local", "YAK_HOME": str(Path(os.environ.get("YAK_HOME", ROOT / ".yak")).resolve()),
           "YAK_PROXY_RECALL_LIMIT": "5" if recall else "0"}
    headers = {"X-API-Key": key}
    local = threading.local()

    def ask(base: str, user: str, text: str) -> None:
        if not hasattr(local, "client"):
            local.client = httpx.Client(timeout=120)
        body = {"model": "fake-model", "user": user, "messages": [{"role": "user", "content": text}]}
        local.client.post(f"{base}/chat/completions", headers=headers, json=body).raise_for_status()

    with connect(url, autocommit=True) as conn, running_yak("proxy", env) as port:
        base = f"http://127.0.0.1:{port}/v1"
        since = conn.execute("SELECT now()").fetchone()[0]
        time.sleep(first_chat_after)
        ask(base, users[0], "first turn after start: what did I say about the garden?")
        answered = time.monotonic()
        first_stored_ms = (_wait_for(conn, users, since, 1) - answered) * 1000
        progress(f"first turn stored {first_stored_ms:.0f} ms after its answer; sending {turns} chats")
        began = time.monotonic()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(lambda i: ask(base, users[i % len(users)], f"burst turn {i}: note number {i} for later"),
                          range(turns)))
        sent = time.monotonic()
        done = _wait_for(conn, users, since, 1 + turns)
    return {"first_chat_after_seconds": first_chat_after, "first_turn_stored_ms": round(first_stored_ms, 1), "turns": turns, "clients": clients, "recall": recall,
            "send_seconds": round(sent - began, 2), "drain_after_last_answer_seconds": round(done - sent, 2),
            "burst_seconds": round(done - began, 2), "stores_per_second": round(turns / (done - began), 1)}


def main(argv: list[str] | None = None) -> int:
    """Load, measure, print the table (or JSON) and write ``bench/results/turn_store_rate_n<N>.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="synthetic memories loaded first (default 10000)")
    parser.add_argument("--users", type=int, default=10, help="users the rows and the turns are spread over")
    parser.add_argument("--turns", type=int, default=200, help="chats in the burst (default 200; under 256)")
    parser.add_argument("--clients", type=int, default=4, help="threads sending the burst (default 4)")
    parser.add_argument("--first-chat-after", type=float, default=20.0,
                        help="seconds between the proxy answering /health and the first chat (default 20)")
    parser.add_argument("--recall", action="store_true", help="recall on in the proxy (default off)")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--label", default="", help="a suffix for the JSON file's name (e.g. before)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    load_before = round(os.getloadavg()[0], 2)
    run = secrets.token_hex(4)
    with scratch_database(get_settings()) as url, \
            FakeOpenAIServer(lambda request: chat_replier(request, tag=f"run {run}")) as upstream:
        progress(f"loading {args.n} distillations across {args.users} users")
        loaded = load(url, args.n, args.users, args.seed)
        build_user_indexes(url, drop=False)
        users = sorted({row[1] for row in loaded["rows"]})
        figures = measure(url, users, upstream, turns=args.turns, clients=args.clients, recall=args.recall,
                          first_chat_after=args.first_chat_after)
    result = {"n": args.n, "users": args.users, **figures,
              "load_average_1m": {"before": load_before, "after": round(os.getloadavg()[0], 2)}}
    path = write_result(f"turn_store_rate_n{args.n}{f'_{args.label}' if args.label else ''}", result)
    if args.json:
        print(json.dumps(result))
        return 0
    rows = [(f"first turn ({args.first_chat_after:g} s after start) stored after its answer", f"{figures['first_turn_stored_ms']:g} ms"),
            (f"{args.turns} chats sent ({args.clients} threads)", f"{figures['send_seconds']:g} s"),
            ("all stored, from the first chat", f"{figures['burst_seconds']:g} s"),
            ("  of which after the last answer", f"{figures['drain_after_last_answer_seconds']:g} s"),
            ("stores a second", f"{figures['stores_per_second']:g}")]
    print_table(f"turn store rate, yak proxy, N = {args.n:,}, recall {'on' if args.recall else 'off'} "
                f"(load {load_before} → {result['load_average_1m']['after']})", rows, headers=("measure", "figure"))
    progress(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
