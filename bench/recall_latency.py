"""Recall latency and fidelity at scale: ``python bench/recall_latency.py --n 100000 --users 10 [--json]``.

Loads N synthetic distillations (1–4 sentences of realistic length, each with its raw exchange)
across U users into a scratch database, with 384-dimensional vectors (the local embedder's size)
drawn around shared topic centres so neighbours exist, and builds the same indexes as the
migrations (HNSW, GIN). Q other queries warm the server up (timed and reported on their own:
the first queries after a bulk load read the indexes from disk into PostgreSQL's buffers), then,
for Q queries at random users:

Users with at least ``store.recall.USER_INDEX_MIN_ROWS`` rows get their own partial HNSW index
(``ensure_user_indexes``, as the maintenance job builds them), so at N = 100,000, U = 10 every
user has one and at N = 10,000 none does (their rows are scanned exactly, in SQL).

- **store, vector-only** — ``store.recall.recall`` (DESIGN §4: ANN over-fetch, exact re-rank);
  fidelity = share of queries whose top-10 equals ``recall_exact`` (every row scored);
- **store, hybrid** — ``store.hybrid.hybrid_recall`` (BM25 + vectors over distillations and
  exchanges, RRF, §4 score); fidelity against ``hybrid_recall_exact`` (every vector leg exact);
- **HTTP** — ``POST /api/distillations/search`` end to end against ``yak serve`` (a real uvicorn
  process on 127.0.0.1) with the local query embedder, the configured recall (hybrid by default).

Targets (issue 5, at N = 100,000, U = 10): store p95 ≤ 10 ms, HTTP p95 ≤ 25 ms, fidelity ≥ 0.99.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import subprocess
import sys
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (  # noqa: E402
    free_port,
    latency_summary,
    print_table,
    progress,
    scratch_database,
    verdict,
    write_result,
)

from yak_pipeline.settings import get_settings  # noqa: E402

DIM = 384
MODEL = "all-MiniLM-L6-v2"
TARGETS = {"store_p95_ms": 10.0, "http_p95_ms": 25.0, "fidelity": 0.99}
_SUBJECTS = ["User", "User's sister", "User's partner", "User's manager", "User's son", "User's best friend"]
_VERBS = ["likes", "is learning", "works on", "visited", "bought", "cooks", "plays", "reads about", "plans",
          "trains for", "volunteers at", "writes about", "collects", "repairs", "photographs"]
_WORDS = ("garden bicycle marathon violin sourdough chess kayak pottery python painting climbing museum "
          "concert novel podcast camping lake mountain recipe guitar tennis swimming yoga budget startup "
          "hospital school library festival wedding holiday apartment kitten puppy horse bakery coffee tea "
          "Lisbon Berlin Tokyo Leeds Oslo Chicago Madrid Seoul Lagos Lima Sunday Monday autumn winter").split()
INDEXES = {
    "distillations_embedding_hnsw": "CREATE INDEX distillations_embedding_hnsw ON distillations USING hnsw (embedding vector_cosine_ops)",
    "memories_embedding_hnsw": "CREATE INDEX memories_embedding_hnsw ON memories USING hnsw (embedding vector_cosine_ops)",
    "distillations_tsv_idx": "CREATE INDEX distillations_tsv_idx ON distillations USING gin (content_tsv)",
    "memories_tsv_idx": "CREATE INDEX memories_tsv_idx ON memories USING gin (content_tsv)",
    "memories_context_tsv_idx": "CREATE INDEX memories_context_tsv_idx ON memories USING gin (context_tsv)",
}


def _sentence(rng: np.random.Generator) -> str:
    words = " ".join(rng.choice(_WORDS, size=int(rng.integers(2, 7))))
    return f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {words}."


def _text(rng: np.random.Generator) -> str:
    return " ".join(_sentence(rng) for _ in range(int(rng.integers(1, 5))))


def _unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v, axis=-1, keepdims=True)).astype(np.float32)


def load(url: str, n: int, users: int, seed: int) -> dict:
    """Bulk-load n memories + distillations with COPY (indexes dropped first, rebuilt after)."""
    from yak_pipeline.store.database import connect
    from yak_pipeline.store.recall import ensure_user_indexes

    rng = np.random.default_rng(seed)
    centres = _unit(rng.normal(size=(max(50, n // 200), DIM)))
    now = datetime.now(timezone.utc)
    started = time.monotonic()
    rows = []
    with connect(url, autocommit=True) as conn:
        for name in INDEXES:
            conn.execute(f"DROP INDEX IF EXISTS {name}")
        # Exchange contexts (sql/006) are computed once after the load, not row by row by the
        # trigger: the same contexts (a test checks that the two agree), minutes sooner.
        conn.execute("ALTER TABLE memories DISABLE TRIGGER memories_context")
        with conn.cursor() as cur:
            with cur.copy("COPY memories (id, user_id, content, occurred_at, source, content_sha256, status, "
                          "embedding, embedding_model) FROM STDIN WITH (FORMAT BINARY)") as copy:
                copy.set_types(["uuid", "text", "text", "timestamptz", "text", "text", "text", "vector", "text"])
                for i in range(n):
                    user = f"bench-user-{i % users}"
                    text = _text(rng)
                    vector = _unit(centres[rng.integers(len(centres))] + rng.normal(size=DIM) * 0.06)
                    when = now - timedelta(days=float(rng.uniform(0, 365)))
                    memory_id = uuid.uuid4()
                    content = f"User: {text.replace('User', 'I')}\nAssistant: Noted. ({i})"
                    digest = hashlib.sha256(content.encode()).hexdigest()
                    exchange_vector = _unit(vector + rng.normal(size=DIM).astype(np.float32) * 0.02)
                    copy.write_row([memory_id, user, content, when, "import", digest, "distilled", exchange_vector, MODEL])
                    rows.append((memory_id, user, text, vector, when))
                    if (i + 1) % 20000 == 0:
                        progress(f"  loaded {i + 1}/{n} memories")
            with cur.copy("COPY distillations (memory_id, user_id, content, confidence, tier, warmth, user_weight, "
                          "status, embedding, embedding_model, prompt_version, refreshed_at) "
                          "FROM STDIN WITH (FORMAT BINARY)") as copy:
                copy.set_types(["uuid", "text", "text", "float8", "text", "float8", "float8", "text", "vector",
                                "text", "text", "timestamptz"])
                tiers = rng.choice(["core", "medium", "low"], size=n, p=[0.2, 0.5, 0.3])
                for (memory_id, user, text, vector, when), tier in zip(rows, tiers):
                    copy.write_row([memory_id, user, text, 0.9, str(tier), float(rng.uniform(0, 1)), 1.0, "active",
                                    vector, MODEL, "bench", when])
        conn.execute("ALTER TABLE memories ENABLE TRIGGER memories_context")
        conn.execute("SELECT yak_rebuild_exchange_context()")
        progress(f"  loaded {n} distillations in {time.monotonic() - started:.0f}s; building indexes")
        conn.execute("SET maintenance_work_mem = '1GB'")
        for name, sql in INDEXES.items():
            index_started = time.monotonic()
            conn.execute(sql)
            progress(f"  built {name} in {time.monotonic() - index_started:.0f}s")
        # What the maintenance job does in production: heavy users get their own HNSW index.
        index_started = time.monotonic()
        built = ensure_user_indexes(conn, concurrently=False)
        progress(f"  built {len(built)} per-user HNSW indexes in {time.monotonic() - index_started:.0f}s")
        # VACUUM as autovacuum would after a bulk load: sets the visibility map that index-only
        # scans (BM25's corpus statistics) rely on.
        conn.execute("VACUUM ANALYZE memories")
        conn.execute("VACUUM ANALYZE distillations")
    return {"rows": rows, "seconds": round(time.monotonic() - started, 1)}


def _queries(rows: list, count: int, seed: int) -> list[tuple[str, str, np.ndarray]]:
    """(user, text, vector) queries near random stored rows: their words and a nearby vector."""
    rng = np.random.default_rng(seed + 1)
    out = []
    for index in rng.integers(len(rows), size=count):
        _, user, text, vector, _ = rows[int(index)]
        words = [w.strip(".") for w in text.split() if w not in ("User", "User's")]
        picked = " ".join(rng.choice(words, size=min(len(words), int(rng.integers(3, 7))), replace=False))
        out.append((user, f"what about {picked}?", _unit(vector + rng.normal(size=DIM).astype(np.float32) * 0.05)))
    return out


def bench_store(url: str, queries: list, limit: int, warmup: list) -> dict:
    """Latency of the store's recall queries and their fidelity to exact scoring of every row.

    ``warmup`` (other queries than the measured ones) runs first, timed on its own: right after
    the load the indexes are not yet in PostgreSQL's buffers. The measured pass then sees the
    steady state of a running server, not the cached answers to its own queries.
    """
    from yak_pipeline.store.database import Database
    from yak_pipeline.store.hybrid import HybridParams, hybrid_recall, hybrid_recall_exact
    from yak_pipeline.store.recall import RecallParams, recall, recall_exact

    params = RecallParams(threshold=0.7, limit=limit)
    hybrid_params = HybridParams()
    results: dict = {}
    with Database(url, max_size=2) as db:
        for name, fast, exact, uses_text in (
            ("vector", recall, recall_exact, False),
            ("hybrid", hybrid_recall, hybrid_recall_exact, True),
        ):
            first = []
            for user, text, vector in warmup:
                kwargs = {"query": text, "hybrid": hybrid_params} if uses_text else {}
                with db.connection() as conn:
                    began = time.perf_counter()
                    fast(conn, user_id=user, query_embedding=vector, embedding_model=MODEL, params=params, **kwargs)
                    first.append((time.perf_counter() - began) * 1000)
            progress(f"  store {name}: {len(warmup)} warm-up queries, p95 {latency_summary(first)['p95']} ms")
            samples, same = [], 0
            for i, (user, text, vector) in enumerate(queries):
                kwargs = {"query": text, "hybrid": hybrid_params} if uses_text else {}
                with db.connection() as conn:
                    began = time.perf_counter()
                    got = fast(conn, user_id=user, query_embedding=vector, embedding_model=MODEL, params=params, **kwargs)
                    samples.append((time.perf_counter() - began) * 1000)
                with db.connection() as conn:
                    want = exact(conn, user_id=user, query_embedding=vector, embedding_model=MODEL, params=params,
                                 **kwargs)
                same += [g.id for g in got] == [w.id for w in want]
                if (i + 1) % 100 == 0:
                    progress(f"  store {name}: {i + 1}/{len(queries)} queries")
            results[name] = {"latency_ms": latency_summary(samples), "fidelity": round(same / len(queries), 4),
                             "warmup_latency_ms": latency_summary(first)}
    return results


def bench_http(url: str, queries: list, limit: int) -> dict:
    """``POST /api/distillations/search`` end to end against a real ``yak serve`` process."""
    import httpx

    key = secrets.token_urlsafe(24)
    port = free_port()
    env = {**os.environ, "YAK_DATABASE_URL": url, "YAK_ADMIN_API_KEY": key,
           "YAK_HOME": str(Path(os.environ.get("YAK_HOME", ".yak")).resolve())}
    server = subprocess.Popen([sys.executable, "-m", "yak_pipeline.cli.main", "serve", "--port", str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, headers={"X-API-Key": key}, timeout=30) as client:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if client.get("/health").status_code < 500:
                        break
                except httpx.TransportError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"yak serve did not start: {server.stderr.read().decode()[-500:] if server.stderr else ''}")
                time.sleep(0.5)
            for user, text, _ in queries[:20]:  # loads the embedding model, warms the pool
                client.post("/api/distillations/search", json={"query": text, "user_id": user, "limit": limit})
            samples, errors = [], 0
            for i, (user, text, _) in enumerate(queries):
                began = time.perf_counter()
                response = client.post("/api/distillations/search", json={"query": text, "user_id": user, "limit": limit})
                samples.append((time.perf_counter() - began) * 1000)
                errors += response.status_code != 200
                if (i + 1) % 100 == 0:
                    progress(f"  http: {i + 1}/{len(queries)} requests")
        return {"latency_ms": latency_summary(samples), "errors": errors}
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print (or emit as JSON) its figures next to the targets."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="synthetic distillations (default 10000)")
    parser.add_argument("--users", type=int, default=10, help="users the rows are spread over (default 10)")
    parser.add_argument("--queries", type=int, default=300, help="queries per measurement (default 300)")
    parser.add_argument("--limit", type=int, default=10, help="recall limit (top-k, default 10)")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--no-http", action="store_true", help="skip the HTTP end-to-end measurement")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    if args.n < 1 or args.users < 1 or args.queries < 1 or args.users > args.n:
        print("error: --n, --users and --queries must be positive, and --users at most --n", file=sys.stderr)
        return 2
    settings = get_settings()
    started = time.monotonic()
    with scratch_database(settings) as url:
        progress(f"loading {args.n} distillations across {args.users} users")
        loaded = load(url, args.n, args.users, args.seed)
        queries = _queries(loaded["rows"], args.queries, args.seed)
        warmup = _queries(loaded["rows"], args.queries, args.seed + 1000)
        store = bench_store(url, queries, args.limit, warmup)
        http = None if args.no_http else bench_http(url, queries, args.limit)
    result = {"n": args.n, "users": args.users, "queries": args.queries, "limit": args.limit, "dimensions": DIM,
              "load_seconds": loaded["seconds"], "store": store, "http": http, "targets": TARGETS,
              "seconds": round(time.monotonic() - started, 1)}
    path = write_result(f"recall_latency_n{args.n}_u{args.users}", result)
    if args.json:
        import json

        print(json.dumps(result))
        return 0
    rows = []
    for name in ("vector", "hybrid"):
        lat = store[name]["latency_ms"]
        rows.append((f"store {name} p50 / p95 / p99 ms", f"{lat['p50']} / {lat['p95']} / {lat['p99']}",
                     f"p95 ≤ {TARGETS['store_p95_ms']:g}", verdict(lat["p95"], TARGETS["store_p95_ms"], higher_is_better=False)))
        rows.append((f"store {name} fidelity (top-{args.limit} = exact)", f"{store[name]['fidelity']:.3f}",
                     f"≥ {TARGETS['fidelity']}", verdict(store[name]["fidelity"], TARGETS["fidelity"], higher_is_better=True)))
        cold = store[name]["warmup_latency_ms"]
        rows.append((f"  (store {name}, first {args.queries} queries after the load: p50 / p95 ms)",
                     f"{cold['p50']} / {cold['p95']}", "", ""))
    if http:
        lat = http["latency_ms"]
        rows.append(("HTTP search p50 / p95 / p99 ms", f"{lat['p50']} / {lat['p95']} / {lat['p99']}",
                     f"p95 ≤ {TARGETS['http_p95_ms']:g}", verdict(lat["p95"], TARGETS["http_p95_ms"], higher_is_better=False)))
    print_table(f"Recall latency, N = {args.n}, U = {args.users} (targets are for N = 100,000, U = 10)", rows)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
