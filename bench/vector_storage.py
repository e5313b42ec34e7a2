"""Where an exchange's vectors are stored, and what an exact scan of one user's exchanges costs.

``python bench/vector_storage.py [--rows-per-user 600] [--users 5] [--queries 300] [--json]``

An exchange row holds its text, tsvectors of itself and of its conversation context, and two
384-dimensional vectors (1.5 kB each). Past PostgreSQL's 2 kB TOAST threshold the vectors, of
the default storage EXTENDED, may be moved out of line, and an exact scan (what recall runs for a
user with up to 2,000 rows: every personal memory for months) then reads them from the TOAST
table row by row. The benchmark loads the same rows into two tables that differ only in the
vectors' storage (EXTENDED, the default, against MAIN: kept in the row unless it cannot fit a
page), VACUUMs both, and times the same exact-scan queries on each, alternating, with their
buffer counts (``EXPLAIN (ANALYZE, BUFFERS)`` of one query). Rows' text lengths come from the
LoCoMo-sized exchanges of the evaluation (about 400 characters and a three-exchange context).
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

DIM = 384
WORDS = ("garden bicycle marathon violin sourdough chess kayak pottery painting climbing museum concert novel "
         "podcast camping lake mountain recipe guitar tennis swimming yoga budget hospital school library festival "
         "wedding holiday apartment kitten puppy bakery coffee tea sister brother morning evening weekend").split()


def main(argv: list[str] | None = None) -> int:
    """Load both tables, time the scans, print the table and write the JSON."""
    import psycopg
    from pgvector.psycopg import register_vector

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows-per-user", type=int, default=600)
    parser.add_argument("--users", type=int, default=5)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(3)
    load_before = os.getloadavg()[0]
    with scratch_database(get_settings()) as url, psycopg.connect(url, autocommit=True) as c:
        register_vector(c)
        for table, storage in (("stored_extended", "EXTENDED"), ("stored_main", "MAIN")):
            c.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, user_id text NOT NULL, content text NOT NULL, "
                      "content_tsv tsvector, context_tsv tsvector, embedding vector(384), context_embedding vector(384))")
            c.execute(f"ALTER TABLE {table} ALTER COLUMN embedding SET STORAGE {storage}, "
                      f"ALTER COLUMN context_embedding SET STORAGE {storage}")
            c.execute(f"CREATE INDEX ON {table} (user_id)")
        rows = []
        for i in range(args.rows_per_user * args.users):
            text = " ".join(rng.choice(WORDS, size=70))  # ~400 characters
            context = " ".join(rng.choice(WORDS, size=210))  # the exchange and its two neighbours
            vector = rng.normal(size=DIM).astype(np.float32)
            rows.append((i, f"u{i % args.users}", text, context, vector / np.linalg.norm(vector),
                         (vector + rng.normal(size=DIM).astype(np.float32) * 0.3)))
        for table in ("stored_extended", "stored_main"):
            with c.cursor() as cur:
                cur.executemany(f"INSERT INTO {table} VALUES (%s, %s, %s, to_tsvector('english', %s), "  # noqa: S608
                                "to_tsvector('english', %s), %s, %s)",
                                [(i, u, t, t, ctx, v, cv / np.linalg.norm(cv)) for i, u, t, ctx, v, cv in rows])
            c.execute(f"VACUUM ANALYZE {table}")
        out_of_line = {table: c.execute(f"SELECT count(*) FILTER (WHERE pg_column_toast_chunk_id(embedding) IS NOT NULL), "  # noqa: S608
                                        f"count(*) FROM {table}").fetchone() for table in ("stored_extended", "stored_main")}
        progress(f"loaded {len(rows)} rows into each table; vectors out of line: {out_of_line}")
        queries = [(f"u{rng.integers(args.users)}", rng.normal(size=DIM).astype(np.float32)) for _ in range(args.queries)]
        sql = ("SELECT id, 1 - (embedding <=> %s) AS similarity FROM {} WHERE user_id = %s "
               "ORDER BY similarity DESC, id LIMIT 50")
        times: dict[str, list[float]] = {"stored_extended": [], "stored_main": []}
        for n, (user, q) in enumerate(queries):
            order = ("stored_extended", "stored_main") if n % 2 else ("stored_main", "stored_extended")
            for table in order:
                began = time.perf_counter()
                c.execute(sql.format(table), (q, user)).fetchall()
                times[table].append((time.perf_counter() - began) * 1000)
        buffers = {}
        for table in times:
            plan = [r[0] for r in c.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql.format(table), queries[0][::-1])]
            buffers[table] = next(line.split("Buffers:")[1].strip() for line in plan if "Buffers:" in line)
    result = {"rows_per_user": args.rows_per_user, "users": args.users, "queries": args.queries,
              "out_of_line": {t: list(v) for t, v in out_of_line.items()},
              "exact_scan_ms": {t: latency_summary(v[len(v) // 10:]) for t, v in times.items()},
              "buffers_one_query": buffers, "load_average_1min": [load_before, os.getloadavg()[0]]}
    path = write_result(f"vector_storage_r{args.rows_per_user}_u{args.users}", result)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        table_rows = [(f"vectors stored {t.split('_')[1].upper()}", f"{s['p50']} / {s['p95']} ms",
                       f"{out_of_line[t][0]} of {out_of_line[t][1]}", buffers[t]) for t, s in result["exact_scan_ms"].items()]
        print_table(f"Exact scan of one user's {args.rows_per_user} exchanges (top 50 by cosine)", table_rows,
                    headers=("storage", "p50 / p95", "vectors out of line", "buffers, one query"))
        print(f"load average (1 min) {load_before:.2f} → {os.getloadavg()[0]:.2f}; written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
