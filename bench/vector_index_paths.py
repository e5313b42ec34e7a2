"""The vector leg's ways to one user's nearest rows, side by side on one table (pgvector 0.8).

``python bench/vector_index_paths.py [--n 100000] [--users 10] [--queries 300] [--json]``

Loads N random 384-dimensional unit vectors (around shared centres, so neighbours exist) over U
users into a scratch database, builds the shared HNSW index and, for comparison, one partial
HNSW index per user (what Yak built under pgvector 0.6, which had no iterative scan), then times
Q queries at random users, each way:

- **exact**: every row of the user scored, sorted (the reference);
- **count**: ``count(*)`` of the user's rows (what the old path ran before choosing a beam);
- **own partial index**: the user's own HNSW index (user id written into the SQL), ef = 2 × 40;
- **shared index, iterative scan** (``hnsw.iterative_scan`` strict / relaxed order), ef = 2 × 40:
  the query Yak runs now.

Each index way reports its agreement with the exact top 10 (mean overlap) and how often it
returned fewer than 40 rows. The 1-minute load average is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import latency_summary, print_table, progress, scratch_database, write_result  # noqa: E402

from yak_pipeline.settings import get_settings  # noqa: E402

DIM, FETCH, EF = 384, 40, 80


def main(argv: list[str] | None = None) -> int:
    """Load, time each way, print the table and write the JSON."""
    import psycopg
    from pgvector.psycopg import register_vector

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    centres = rng.normal(size=(50, DIM))
    load_before = os.getloadavg()[0]
    with scratch_database(get_settings()) as url, psycopg.connect(url, autocommit=True) as c:
        register_vector(c)
        c.execute("CREATE TABLE bench_vectors (id bigint PRIMARY KEY, user_id text NOT NULL, e vector(384) NOT NULL)")
        started = time.monotonic()
        with c.cursor().copy("COPY bench_vectors (id, user_id, e) FROM STDIN WITH (FORMAT BINARY)") as copy:
            copy.set_types(["int8", "text", "vector"])
            for i in range(args.n):
                v = centres[rng.integers(50)] + rng.normal(size=DIM) * 0.8
                copy.write_row((i, f"u{i % args.users}", (v / np.linalg.norm(v)).astype(np.float32)))
        c.execute("CREATE INDEX ON bench_vectors (user_id)")
        c.execute("SET maintenance_work_mem = '1GB'")
        c.execute("CREATE INDEX bench_vectors_hnsw ON bench_vectors USING hnsw (e vector_cosine_ops)")
        for u in range(args.users):
            c.execute(f"CREATE INDEX bench_vectors_u{u} ON bench_vectors USING hnsw (e vector_cosine_ops) "
                      f"WHERE user_id = 'u{u}'")
        c.execute("VACUUM ANALYZE bench_vectors")
        progress(f"loaded and indexed {args.n} vectors in {time.monotonic() - started:.0f} s")
        queries = [(f"u{rng.integers(args.users)}", (centres[rng.integers(50)] + rng.normal(size=DIM)).astype(np.float32))
                   for _ in range(args.queries)]

        def run(fn) -> tuple[list[float], list[list[int]]]:  # noqa: ANN001
            times, results = [], []
            for user, q in queries:
                with c.transaction():
                    began = time.perf_counter()
                    results.append(fn(user, q))
                    times.append((time.perf_counter() - began) * 1000)
            return times[len(times) // 6:], results  # the first sixth warms the buffers

        def exact(user: str, q: np.ndarray) -> list[int]:
            return [r[0] for r in c.execute("SELECT id FROM bench_vectors WHERE user_id = %s "
                                            "ORDER BY 1 - (e <=> %s) DESC, id LIMIT %s", (user, q, FETCH))]

        def count(user: str, q: np.ndarray) -> list[int]:
            return [c.execute("SELECT count(*) FROM bench_vectors WHERE user_id = %s", (user,)).fetchone()[0]]

        def own(user: str, q: np.ndarray) -> list[int]:
            c.execute("SELECT set_config('hnsw.ef_search', %s, true)", (str(EF),))
            return [r[0] for r in c.execute(f"SELECT id FROM bench_vectors WHERE user_id = '{user}' "  # noqa: S608
                                            "ORDER BY e <=> %s LIMIT %s", (q, FETCH))]

        def shared(order: str):  # noqa: ANN202
            def query(user: str, q: np.ndarray) -> list[int]:
                c.execute("SELECT set_config('hnsw.ef_search', %s, true), set_config('hnsw.iterative_scan', %s, true)",
                          (str(EF), order))
                # Generic plan: the user id is a parameter the planner cannot match to a partial index.
                c.execute("SELECT set_config('plan_cache_mode', 'force_generic_plan', true)")
                return [r[0] for r in c.execute("SELECT id FROM bench_vectors WHERE user_id = %s ORDER BY e <=> %s "
                                                "LIMIT %s", (user, q, FETCH), prepare=True)]
            return query

        timings, rows = {}, []
        _, reference = run(exact)
        for name, fn in [("exact scan of the user's rows", exact), ("count(*) of the user's rows", count),
                         ("own partial index", own), ("shared index, iterative strict_order", shared("strict_order")),
                         ("shared index, iterative relaxed_order", shared("relaxed_order"))]:
            times, results = run(fn)
            summary = latency_summary(times)
            entry = {"ms": summary}
            if fn is not count and fn is not exact:
                entry["top10_overlap"] = round(float(np.mean([len(set(a[:10]) & set(b[:10])) / 10
                                                               for a, b in zip(results, reference)])), 4)
                entry["short_results"] = sum(len(r) < FETCH for r in results)
            timings[name] = entry
            rows.append((name, f"{summary['p50']} / {summary['p95']} ms",
                         f"{entry.get('top10_overlap', '-')}", f"{entry.get('short_results', '-')}"))
            progress(f"  {name}: p50 {summary['p50']} ms")
    payload = {"n": args.n, "users": args.users, "queries": args.queries, "fetch": FETCH, "ef_search": EF,
               "ways": timings, "load_average_1min": [load_before, os.getloadavg()[0]]}
    path = write_result(f"vector_index_paths_n{args.n}_u{args.users}", payload)
    if args.json:
        print(json.dumps(payload, indent=2))
    else:
        print_table(f"One user's {FETCH} nearest of {args.n} vectors ({args.users} users)", rows,
                    headers=("way", "p50 / p95", "top-10 overlap with exact", f"fewer than {FETCH} rows"))
        print(f"load average (1 min) {load_before:.2f} → {os.getloadavg()[0]:.2f}; written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
