"""What the memory proxy adds to a chat: time to first token and total, p50/p95.

``python bench/proxy_latency.py --n 100000 --users 10 [--queries 200] [--corpus realistic] [--reuse DB] [--json]``

Loads N memories over U users into a scratch database (``recall_latency.load``: the same rows
and indexes as the recall benchmark, synthetic or, with ``--corpus realistic``, real turns with
real questions as the chats; ``--reuse`` measures a database a ``recall_latency.py --corpus
realistic --keep`` run loaded), labelled with the local embedder's model, and
the per-user indexes of ``recall_latency.build_user_indexes`` unless ``--no-user-indexes``),
starts ``yak proxy`` as a real process (local all-MiniLM-L6-v2 query embedder,
the recall engine, turns stored) in front of an upstream that answers at once (the tests'
loopback OpenAI-protocol server, streaming word by word), and sends each of Q chats twice, to
the upstream directly and through the proxy, streamed and not, each pair's order and which kind
goes first alternating:

- **TTFT**: from sending the request to the first server-sent event;
- **total**: to the end of the answer. The proxy stores the turn just after the response
  (``services.turn_writer``), so the total leaves that out, but the store runs while the next chat
  is served, as it would for a client that asks again at once; the upstream tags its answers
  with the run, so each stored turn is a new exchange.

**The bench keeps to a pace the turn writer can store.** Storing a new turn embeds its exchange
twice (its own text, then in context) with the local torch model on one CPU thread: 70-200 ms for
the two on this 2-core machine while chats run, so the one writer thread stores about 8 turns a
second, while this bench, whose upstream answers at once, sent about 30. Once 256 turns wait
(``MAX_WAITING_TURNS``), each chat stores its own turn before its end, by design (a client is
slowed rather than Yak holding an ever longer backlog). Sent back to back, the chats reached that
limit at the 55th query of 100 (turn 256 of 440: 40 warm-up turns, then four a query), and from
then on about half the chats, those that found the queue full, carried a store of 100-200 ms in
their total; the writer's first store also loads the torch model (7-17 s). That is the proxy's sustained throughput, not what one chat adds (see
docs/BENCHMARKS.md, issue 34). Since then the writer stores the turns waiting as one batch, with
one model call per kind for the batch (``bench/turn_store_rate.py``: 17-18 turns a second against
11.3-11.5, load 2.6-3.9), and ``yak proxy`` loads the model in the background as it starts, so
with the warm-up's 40 turns the first store no longer waits for the load unless the chats come
sooner than the load ends, as here, where the warm-up chats start as soon as ``/health`` answers. So after the warm-up, and after each query's chats (four proxied
turns), the bench waits until the database holds every turn sent so far with its vector, and
times that wait: the **store lag** rows, how long after a query's last answer its four turns were
stored. Within a query the stores still run beside the next chats, as for a client that asks
again at once.

The same chats are also sent in Anthropic's Messages protocol (``/v1/messages``, issue 34) to a
loopback Messages API, direct and through the same proxy process, streamed and not: the Messages
rows beside the OpenAI ones.

The figures are the per-chat differences (proxy − direct). The same chats are then sent through
a proxy with ``YAK_PROXY_RECALL_LIMIT=0`` (no recall, everything else the same), which splits the
added time into the proxy's own plumbing (keys, parsing, forwarding, relaying, storing the turn)
and recall (query embedding and the recall engine, as ``/api/context`` runs them). Target (issue 13): added p95 ≤ 40 ms
at N = 100,000. The 1-minute load average is recorded: the figures are only as quiet as the
machine was.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    ROOT,
    freeze_heap,
    latency_summary,
    print_table,
    progress,
    reused_database,
    running_yak,
    scratch_database,
    verdict,
    write_result,
)
from recall_latency import (  # noqa: E402
    RealisticCorpus,
    _queries,
    add_corpus_options,
    build_user_indexes,
    corpus_options_valid,
    load_or_reuse,
)

from yak_loopback.anthropic_server import FakeAnthropicServer  # noqa: E402
from yak_loopback.openai_replies import chat_replier  # noqa: E402
from yak_loopback.openai_server import FakeOpenAIServer  # noqa: E402
from yak_pipeline.settings import get_settings  # noqa: E402

TARGET_ADDED_P95_MS = 40.0


def _chat(client, url: str, headers: dict, body: dict) -> tuple[float, float]:  # noqa: ANN001 - httpx.Client
    """(time to first event, total) of one streamed chat, in ms."""
    began = time.perf_counter()
    first = None
    with client.stream("POST", url, headers=headers, json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if first is None and line.startswith("data:"):
                first = time.perf_counter()
    end = time.perf_counter()
    return ((first or end) - began) * 1000, (end - began) * 1000


def _whole(client, url: str, headers: dict, body: dict) -> float:  # noqa: ANN001 - httpx.Client
    """Total time of one chat that is not streamed, in ms."""
    began = time.perf_counter()
    client.post(url, headers=headers, json=body).raise_for_status()
    return (time.perf_counter() - began) * 1000


# Longer than any store lag seen (the first store loads the torch model: 8-17 s on a busy machine).
STORE_WAIT_SECONDS = 120.0


class StoredTurns:
    """Counts the proxied turns the database holds with their own vector, for the bench to wait for the
    turn writer. The context vector is one model call after it and may overlap the next query's first
    chat; it is not waited for, as a later turn of the same user can reset it (sql/008)."""

    def __init__(self, url: str, users: list[str]) -> None:
        from yak_pipeline.store.database import connect

        self._conn = connect(url, autocommit=True)
        self._users = users
        # Turns occur when the proxy answers: every memory from now on (memories_occurred_idx) is one of them.
        self._since = self._conn.execute("SELECT now()").fetchone()[0]
        self._before = self._count()  # a loaded row dated after now is no turn of this pass
        self.sent = 0

    def stored(self) -> int:
        """Turns of this pass stored and embedded so far."""
        return self._count() - self._before

    def _count(self) -> int:
        return self._conn.execute(
            """SELECT count(*) FROM memories WHERE user_id = ANY(%(users)s) AND occurred_at >= %(since)s
                 AND embedding IS NOT NULL""", {"users": self._users, "since": self._since}).fetchone()[0]

    def wait(self) -> float:
        """Wait until every turn sent is stored; the ms waited. Raises after ``STORE_WAIT_SECONDS``."""
        began = time.perf_counter()
        while self.stored() < self.sent:
            if time.perf_counter() - began > STORE_WAIT_SECONDS:
                raise RuntimeError(f"the proxy stored {self.stored()} of {self.sent} turns in {STORE_WAIT_SECONDS:g} s")
            time.sleep(0.005)
        return (time.perf_counter() - began) * 1000

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()


def bench(url: str, queries: list, upstream: FakeOpenAIServer, anthropic: FakeAnthropicServer, *,
          recall: bool = True) -> dict:
    """Every query direct and through a ``yak proxy`` process, in both protocols; the per-query differences,
    each query's chats sent once the turns before them are stored (module docstring)."""
    import httpx

    key = secrets.token_urlsafe(24)
    env = {**os.environ, "YAK_DATABASE_URL": url, "YAK_ADMIN_API_KEY": key, "YAK_UPSTREAM_BASE_URL": upstream.base_url,
           "YAK_UPSTREAM_ANTHROPIC_BASE_URL": anthropic.base_url,
           "YAK_HOME": str(Path(os.environ.get("YAK_HOME", ROOT / ".yak")).resolve()),
           "YAK_PROXY_RECALL_LIMIT": "5" if recall else "0"}
    direct_headers, proxy_headers = {}, {"X-API-Key": key}
    # Claude Code's way: its own Anthropic key goes upstream, the Yak key (admin: the user in metadata) beside it.
    anthropic_headers = {"x-api-key": "sk-ant-bench", "anthropic-version": "2023-06-01"}
    messages_direct, messages_proxy = anthropic_headers, {**anthropic_headers, "X-Yak-Key": key}
    turns = StoredTurns(url, sorted({user for user, _, _ in queries}))
    with running_yak("proxy", env) as port, httpx.Client(timeout=60) as client:
        root = f"http://127.0.0.1:{port}"  # Anthropic's clients add /v1/messages to it
        base = f"{root}/v1"

        def body(user: str, text: str, stream: bool) -> dict:
            return {"model": "fake-model", "user": user, "stream": stream,
                    "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": text}]}

        def streamed(user: str, text: str, order: list) -> dict:
            return {name: _chat(client, f"{where}/chat/completions", headers, body(user, text, True))
                    for name, where, headers in order}

        def not_streamed(user: str, text: str, order: list) -> dict:
            return {name: _whole(client, f"{where}/chat/completions", headers, body(user, f"{text} (whole)", False))
                    for name, where, headers in order}

        def message(user: str, text: str, stream: bool) -> dict:
            return {"model": "claude-fake-1", "max_tokens": 256, "stream": stream, "system": "You are terse.",
                    "metadata": {"user_id": user}, "messages": [{"role": "user", "content": f"{text} (messages)"}]}

        def messages_streamed(user: str, text: str, order: list) -> dict:
            return {name: _chat(client, f"{where}/v1/messages", headers, message(user, text, True))
                    for name, where, headers in order}

        def messages_whole(user: str, text: str, order: list) -> dict:
            return {name: _whole(client, f"{where}/v1/messages", headers, message(user, f"{text} (whole)", False))
                    for name, where, headers in order}

        for user, text, _ in queries[:20]:  # loads the query embedder, warms the pool and the caches
            _chat(client, f"{base}/chat/completions", proxy_headers, body(user, f"warm up: {text}", True))
            _chat(client, f"{root}/v1/messages", messages_proxy, message(user, f"warm up: {text}", True))
        turns.sent += 2 * len(queries[:20])
        warm_up_stored_ms = turns.wait()  # the first store loads the torch model for documents
        kinds = {protocol: {"ttft": [], "total": [], "whole": [], "direct_ttft": [], "proxy_ttft": []}
                 for protocol in ("openai", "messages")}
        store_lag = []
        for i, (user, text, _) in enumerate(queries[20:]):
            runs = {"openai": ([("direct", upstream.base_url, direct_headers), ("proxy", base, proxy_headers)],
                               streamed, not_streamed),
                    "messages": ([("direct", anthropic.base_url, messages_direct),
                                  ("proxy", root, messages_proxy)], messages_streamed, messages_whole)}
            for protocol, (order, stream_kind, whole_kind) in runs.items():
                if i % 2:
                    order.reverse()
                # Which kind goes first alternates too: the second recalls for nearly the same words and
                # finds the first one's pages in PostgreSQL's buffers.
                if (i // 2) % 2:
                    whole, timings = whole_kind(user, text, order), stream_kind(user, text, order)
                else:
                    timings, whole = stream_kind(user, text, order), whole_kind(user, text, order)
                measured = kinds[protocol]
                measured["ttft"].append(timings["proxy"][0] - timings["direct"][0])
                measured["total"].append(timings["proxy"][1] - timings["direct"][1])
                measured["whole"].append(whole["proxy"] - whole["direct"])
                measured["direct_ttft"].append(timings["direct"][0])
                measured["proxy_ttft"].append(timings["proxy"][0])
            turns.sent += 4  # streamed and not, in each protocol
            store_lag.append(turns.wait())
            if (i + 1) % 50 == 0:
                progress(f"  {'' if recall else 'no recall: '}{i + 1}/{len(queries) - 20} chats")

    def summary(measured: dict) -> dict:
        return {"added_ttft_ms": latency_summary(measured["ttft"]), "added_total_ms": latency_summary(measured["total"]),
                "added_total_not_streamed_ms": latency_summary(measured["whole"]),
                "direct_ttft_ms": latency_summary(measured["direct_ttft"]),
                "proxy_ttft_ms": latency_summary(measured["proxy_ttft"])}

    turns.close()
    return {**summary(kinds["openai"]), "messages": summary(kinds["messages"]),
            "store_lag_ms": latency_summary(store_lag), "warm_up_stored_ms": round(warm_up_stored_ms, 1)}


def main(argv: list[str] | None = None) -> int:
    """Load, measure, print the table (or JSON) and write ``bench/results/proxy_latency_n<N>.json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="synthetic memories (default 10000)")
    parser.add_argument("--users", type=int, default=10, help="users the rows are spread over (default 10)")
    parser.add_argument("--queries", type=int, default=200, help="chats measured (default 200)")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    add_corpus_options(parser)
    parser.add_argument("--no-user-indexes", action="store_true",
                        help="leave out the per-user indexes the nightly recall_index_job builds (store.user_indexes)")
    args = parser.parse_args(argv)
    if not corpus_options_valid(args):
        return 2
    settings = get_settings()
    load_before = round(os.getloadavg()[0], 2)
    database = reused_database(settings, args.reuse) if args.reuse else scratch_database(settings)
    # Every answer carries this run's and this pass's tag, so every turn the proxy stores is a new
    # exchange, as in use: a turn stored before (the same chat in the other pass, or in an earlier
    # run on a --reuse database) is found by its text and not written again, in 1.8 ms p50 against
    # 9.7 for a new one at 100,000 memories (sql/006's context trigger, docs/BENCHMARKS.md §2h).
    run, tag = secrets.token_hex(4), {"pass": ""}
    replier = lambda request: chat_replier(request, tag=f"run {run}{tag['pass']}")  # noqa: E731
    with database as url, FakeOpenAIServer(replier) as upstream, FakeAnthropicServer() as anthropic:
        anthropic.tag = f" (run {run})"  # the Messages turns are new exchanges too (a --reuse database)
        corpus = RealisticCorpus(args.data_dir) if args.corpus == "realistic" else None
        loaded = load_or_reuse(url, args, corpus)
        user_indexes = build_user_indexes(url, drop=args.no_user_indexes)
        queries = (corpus.queries(args.users, args.queries + 20, args.seed) if corpus is not None
                   else _queries(loaded["rows"], args.queries + 20, args.seed))
        freeze_heap()  # the client and the fake upstream run in this process, beside the corpus
        figures = bench(url, queries, upstream, anthropic)
        tag["pass"] = ", no recall"
        anthropic.tag = f" (run {run}, no recall)"
        plumbing = bench(url, queries, upstream, anthropic, recall=False)
    result = {"n": args.n, "users": args.users, "queries": args.queries, "corpus": args.corpus,
              "load_seconds": loaded["seconds"],
              "user_indexes": user_indexes, **figures, "without_recall": plumbing, "target_added_p95_ms": TARGET_ADDED_P95_MS,
              "load_average_1m": {"before": load_before, "after": round(os.getloadavg()[0], 2)}}
    path = write_result(f"proxy_latency_n{args.n}{'_realistic' if corpus is not None else ''}", result)
    if args.json:
        print(json.dumps(result))
        return 0
    rows = []
    # Each measure's Messages row right under its OpenAI row; the verdict against the target for both.
    for pass_label, measured in (("", figures), ("no recall: ", plumbing)):
        for name, key in (("TTFT, streamed", "added_ttft_ms"), ("total, streamed", "added_total_ms"),
                          ("total, not streamed", "added_total_not_streamed_ms")):
            for protocol, figures_of in (("OpenAI", measured), ("Messages", measured["messages"])):
                lat = figures_of[key]
                rows.append((f"{pass_label}{protocol} added {name}", f"{lat['p50']:g} / {lat['p95']:g} ms",
                             f"p95 ≤ {TARGET_ADDED_P95_MS:g} ms" if not pass_label else "",
                             "" if pass_label else verdict(lat["p95"], TARGET_ADDED_P95_MS, higher_is_better=False)))
    for pass_label, measured in (("", figures), ("no recall: ", plumbing)):
        lag = measured["store_lag_ms"]
        rows.append((f"{pass_label}store lag, a query's 4 turns (warm-up's)",
                     f"{lag['p50']:g} / {lag['p95']:g} ms ({measured['warm_up_stored_ms']:g} ms)", "", ""))
    print_table(f"memory proxy, N = {args.n:,}, U = {args.users}, {args.corpus} corpus, {args.queries} chats, "
                f"p50 / p95 "
                f"(load {load_before} → {result['load_average_1m']['after']}; "
                f"{user_indexes['in_all']} per-user recall indexes)", rows)
    progress(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
