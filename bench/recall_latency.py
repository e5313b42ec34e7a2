"""Recall latency, the old engine against the new (A/B), raw candidates on against off, and fidelity at scale.

``python bench/recall_latency.py --n 100000 --users 10 [--queries 300] [--undistilled-share 0.2] [--no-http] [--json]``

Loads N synthetic distillations (1–4 sentences of realistic length, each with its raw exchange)
across U users into a scratch database, with 384-dimensional vectors (the local embedder's size)
drawn around shared topic centres so neighbours exist, labelled ``all-MiniLM-L6-v2`` so that the
relevance model shipped for that embedder applies (``recall_models.load_relevance_model``; the
vectors are random, so its *figures* mean nothing here, only its cost does), and builds the same
indexes as the migrations (HNSW, GIN), then the per-user HNSW indexes the nightly
``recall_index_job`` builds (``store.user_indexes``; ``--no-user-indexes`` leaves them out and
measures the shared index alone, read with pgvector's iterative scan). Users with more than
``store.vector_legs.EXACT_SCAN_MAX_ROWS`` rows are served by an index: at N = 100,000, U = 10 every user
is, at N = 10,000 none is (their rows are scanned exactly, in SQL). ``--keep`` keeps the loaded
database and ``--reuse NAME`` measures it again (realistic corpus) without the ten-minute load.

**Raw candidates.** Recall also proposes, as the user's own words (``Candidate.kind == "raw"``),
the exchanges no active distillation holds. In use those are a steady share: the turns stored
since the last nightly distillation, and those whose distillation the confidence gate sent to
review or rejected. ``--undistilled-share S`` (default 0.2, a fifth; 0 loads every exchange
held, as runs before this option did) makes that share of the exchanges unheld: their
distillations are in ``review`` (confidence 0.45, under the gate), so the distillation legs do
not find them and the exchange legs' hits on them become raw candidates. Which exchanges is a
fixed rule on the exchange's id (the first 32 bits of its MD5 below S × 2³²), applied while
loading and again, idempotently, to a database measured with ``--reuse`` (``apply_undistilled_share``: only
distillations not already as the rule says are re-set; a database loaded before this option has
all of them active, and the first reuse at 0.2 puts a fifth in review, which the kept database
then keeps; ``--undistilled-share 0`` sets them all active again). The share recall then sees
(exchanges with no active distillation, proxied turns a ``proxy_latency.py`` run stored included)
is counted and written to the JSON (``undistilled``).

Q other queries warm the server up (timed and reported on their own: the first
queries after a bulk load read the indexes from disk into PostgreSQL's buffers), then, for Q
queries at random users:

- **store, A/B** — both engines share their candidate legs, so each query runs them once and
  times, on the same candidates:

  (a) ``store.recall.recall_candidates``: the four legs (BM25 and vectors over distillations and
      exchanges) and the one candidate-row query;
  (b) the OLD ranking: weighted reciprocal-rank fusion over ``Candidate.ranks`` as the removed
      ``store/hybrid.py`` did it (``fuse`` of commit 06f3bdf: weights text 1, vector 1, exchange
      legs × 2, ``rrf_k`` 1, relevance = (fused / best possible)^6, score = relevance × decay ×
      (1 + warmth) × gravity);
  (c) the NEW ranking: ``core.recall.rank_memories`` (calibrated relevance per candidate, the
      tier gate on it, the score on its odds): the relevance step, in Python.

  (a) and (c) are with raw candidates on, as shipped; the old fusion leaves raw candidates out
  (the old engine dropped an exchange no active distillation held).

  old = a + b, new = a + c (``store.recall.recall`` is exactly ``recall_candidates`` followed by
  ``rank_memories``; the bench checks that it returns the same ids). The cost of the relevance
  step is new − old. Two differences of the old engine are not reproduced: it gated vector-leg
  hits on their raw cosine before fusing (a few microseconds of Python; the new legs have no
  such gate), and its candidate-row query read the distillation's cosine only, where the new one
  joins each candidate's exchange and computes its cosine too (and the supersession join). That
  SQL difference is measured on its own: after each query both candidate-row queries are re-run
  on the same ids (order alternating), and ``a − Δsql + b`` is the old engine with its own query.
- **store, raw candidates A/B** — per query, ``recall_candidates`` also runs with
  ``dataclasses.replace(params, raw_exchanges=False)`` (a'), on the same query vector, side by
  side as (a), and ``rank_memories`` ranks those candidates (c'). The three readings of each
  query's candidates (a, a', and the legs one after another) go in each of their six orders in
  turn, so of any two each goes first in half of the queries; the two rankings alternate. Reported:
  p50/p95/p99 of on (a + c) and off (a' + c'), their differences (of the percentiles, and per
  query), the raw rows query's time inside (a), raw candidates per query (``kind == "raw"``), the
  share of queries with a raw memory in the top ``--limit`` (10) and how many, and how often the
  top is the same either way.
- **fidelity** — share of queries whose top-10 with the index path (``exact=False``) equals the
  exact reference (``exact=True``: every vector leg scans every row of the user), for the new
  engine (the target) and, for information, the old ranking over the same candidates;
- **HTTP** — ``POST /api/context`` (and ``/api/distillations/search`` beside it) end to end against ``yak serve`` (a real uvicorn
  process on 127.0.0.1) with the local query embedder and the new engine (raw candidates as
  ``YAK_RECALL_RAW_EXCHANGES`` says, on by default; so does the CPU pass);
- **CPU per recall** — the request's path in this process (``services.recall.search_memories``:
  the query's vector, the legs, the relevance step, the memories' rows), one recall at a time: the
  machine's busy CPU (this process and PostgreSQL's backends, from /proc/stat) and this process's
  own. CPU ÷ cores is the least wall time a recall can take however its work is spread.

Targets (issue "Fast on the default path", at N = 100,000, U = 10): store p95 ≤ 15 ms (the new
engine, a + c), HTTP p95 ≤ 30 ms, fidelity ≥ 0.99. The 1-minute load average is recorded before
and after: the figures are only as quiet as the machine was.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import secrets
import sys
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from itertools import permutations
from pathlib import Path

import numpy as np

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

from yak_pipeline.settings import get_settings  # noqa: E402
from yak_pipeline.store.user_indexes import USER_INDEX_MIN_ROWS  # noqa: E402

DIM = 384
MODEL = "all-MiniLM-L6-v2"
# http_p95_over_floor: issue 37, HTTP p95 at most 1.5 × the CPU floor of the same run.
TARGETS = {"store_p95_ms": 15.0, "http_p95_ms": 30.0, "fidelity": 0.99, "http_p95_over_floor": 1.5}
# Share of the exchanges no active distillation holds (module docstring, "Raw candidates").
DEFAULT_UNDISTILLED_SHARE = 0.2
ACTIVE_CONFIDENCE = 0.9   # what load() gives an active distillation (the gate needs >= 0.6)
REVIEW_CONFIDENCE = 0.45  # a distillation the confidence gate sent to review: under 0.6
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
    "memories_context_embedding_hnsw": "CREATE INDEX memories_context_embedding_hnsw ON memories "
                                       "USING hnsw (context_embedding vector_cosine_ops)",
    "distillations_tsv_idx": "CREATE INDEX distillations_tsv_idx ON distillations USING gin (user_id, content_tsv)",
    "memories_tsv_idx": "CREATE INDEX memories_tsv_idx ON memories USING gin (user_id, content_tsv)",
    "memories_context_tsv_idx": "CREATE INDEX memories_context_tsv_idx ON memories USING gin (user_id, context_tsv)",
}


def _sentence(rng: np.random.Generator) -> str:
    words = " ".join(rng.choice(_WORDS, size=int(rng.integers(2, 7))))
    return f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {words}."


def _text(rng: np.random.Generator) -> str:
    return " ".join(_sentence(rng) for _ in range(int(rng.integers(1, 5))))


def _unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v, axis=-1, keepdims=True)).astype(np.float32)


def synthetic_rows(n: int, rng: np.random.Generator):
    """The stress case: (distillation text, exchange text, vector) from a 60-word vocabulary,
    vectors around shared topic centres. A query's words match about half of a user's rows."""
    centres = _unit(rng.normal(size=(max(50, n // 200), DIM)))
    for i in range(n):
        text = _text(rng)
        vector = _unit(centres[rng.integers(len(centres))] + rng.normal(size=DIM) * 0.06)
        yield text, f"User: {text.replace('User', 'I')}\nAssistant: Noted. ({i})", vector


class RealisticCorpus:
    """Real conversational text: the turns of the LoCoMo-format files in ``data_dir`` resampled.

    Each row is one turn (what the user said) and the turn that answered it, drawn at random from
    every conversation of every file; its distillation is the turn's own text and its vector the
    local model's embedding of that text (each distinct turn embedded once; a little noise tells
    the copies of one turn in different rows apart). The queries are the files' real questions,
    embedded as recall embeds a question (``embed_query``). The vocabulary and the lengths are
    real; that several users said the same sentence is not, and is the price of 100,000 rows.
    """

    def __init__(self, data_dir: Path) -> None:
        from yak_pipeline.embeddings.local import LocalMiniLMEmbedder
        from yak_pipeline.eval.locomo import load_locomo

        files = sorted(data_dir.glob("*/*.json"))
        if not files:
            raise SystemExit(f"error: no LoCoMo-format .json files under {data_dir} (--data-dir)")
        self.pairs: list[tuple[str, str]] = []
        self.questions: list[str] = []
        for path in files:
            for conversation in load_locomo(path):
                turns = conversation.turns
                self.pairs += [(a.text, b.text) for a, b in zip(turns, turns[1:]) if a.text.strip() and b.text.strip()]
                self.questions += [q.question for q in (*conversation.questions, *conversation.never_said)]
        embedder = LocalMiniLMEmbedder()
        distinct = sorted({said for said, _ in self.pairs})
        progress(f"  realistic corpus: {len(self.pairs)} turn pairs, {len(distinct)} distinct turns, "
                 f"{len(self.questions)} questions from {len(files)} files; embedding them …")
        self.vectors = dict(zip(distinct, np.asarray(embedder.embed_documents(distinct), dtype=np.float32)))
        self.question_vectors = [np.asarray(embedder.embed_query(q), dtype=np.float32) for q in self.questions]

    def rows(self, n: int, rng: np.random.Generator):
        """(distillation text, exchange text, vector) for n rows."""
        for i in rng.integers(len(self.pairs), size=n):
            said, answer = self.pairs[int(i)]
            yield said, f"User: {said}\nAssistant: {answer} [{int(i)}-{rng.integers(1 << 30)}]", \
                _unit(self.vectors[said] + rng.normal(size=DIM).astype(np.float32) * 0.01)

    def queries(self, users: int, count: int, seed: int) -> list[tuple[str, str, np.ndarray]]:
        """(user, question, its vector) for ``count`` real questions asked of random users."""
        rng = np.random.default_rng(seed + 1)
        picked = rng.integers(len(self.questions), size=count)
        return [(f"bench-user-{int(rng.integers(users))}", self.questions[int(i)], self.question_vectors[int(i)])
                for i in picked]


def add_corpus_options(parser: argparse.ArgumentParser) -> None:
    """``--corpus``, ``--data-dir`` and ``--reuse``: what this benchmark and ``proxy_latency.py`` measure on."""
    parser.add_argument("--corpus", choices=("synthetic", "realistic"), default="synthetic",
                        help="synthetic: a 60-word vocabulary (the stress case); realistic: real conversational "
                             "turns and questions from --data-dir (default synthetic)")
    parser.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "data",
                        help="LoCoMo-format files for --corpus realistic (default ../shared/data)")
    parser.add_argument("--reuse", metavar="DATABASE",
                        help="measure a database a `recall_latency.py --corpus realistic --keep` run loaded (same "
                             "--n, --users and --seed), instead of loading a new one; it is kept")


def corpus_options_valid(args: argparse.Namespace) -> bool:
    """False, with the reason on stderr, when ``--reuse`` comes without ``--corpus realistic``."""
    if args.reuse and args.corpus != "realistic":
        print("error: --reuse needs --corpus realistic (the synthetic queries come from the rows loaded)", file=sys.stderr)
        return False
    return True


def load_or_reuse(url: str, args: argparse.Namespace, corpus: RealisticCorpus | None) -> dict:
    """The rows :func:`load` loads now, or none when ``--reuse`` measures a database loaded before."""
    if args.reuse:
        progress(f"measuring {args.reuse}, loaded before")
        return {"rows": [], "seconds": None}
    share = getattr(args, "undistilled_share", 0.0)  # proxy_latency.py has no such option: all held
    progress(f"loading {args.n} distillations across {args.users} users ({args.corpus} corpus"
             f"{f', {share:g} of the exchanges undistilled' if share else ''})")
    return load(url, args.n, args.users, args.seed, corpus, undistilled_share=share)


def apply_undistilled_share(url: str, share: float) -> dict:
    """Make exactly the exchanges of ``share`` (:func:`_unheld`) unheld, idempotently, and count them.

    A bench distillation (``prompt_version = 'bench'``) of an exchange in the share is set to
    ``review`` (confidence under the gate), any other one to ``active``; only rows not already so
    are written (none right after :func:`load`, which loaded them so; on a ``--reuse``d database
    from a run before this option, all of them active, a fifth at the default share). The BM25
    postings follow by their trigger; written rows are vacuumed and analysed as after the load.
    Then counts what recall sees: exchanges with no active distillation (proxied turns a
    ``proxy_latency.py`` run stored without distilling them count too).
    """
    from yak_pipeline.store.database import connect

    started = time.monotonic()
    args = {"cut": _share_cut(share), "unheld": REVIEW_CONFIDENCE, "held": ACTIVE_CONFIDENCE}
    with connect(url, autocommit=True) as conn:
        changed = conn.execute(
            f"""UPDATE distillations
                SET status = CASE WHEN {_UNHELD_SQL} THEN 'review' ELSE 'active' END,
                    confidence = CASE WHEN {_UNHELD_SQL} THEN %(unheld)s ELSE %(held)s END
                WHERE prompt_version = 'bench' AND deleted_at IS NULL AND status IN ('active', 'review')
                  AND status <> CASE WHEN {_UNHELD_SQL} THEN 'review' ELSE 'active' END""", args).rowcount
        if changed:
            for table in ("distillations", "bm25_postings", "bm25_statistics"):
                conn.execute(f"VACUUM ANALYZE {table}")
        exchanges, unheld = conn.execute(
            """SELECT count(*), count(*) FILTER (WHERE NOT EXISTS (
                      SELECT 1 FROM distillations d WHERE d.memory_id = m.id AND d.status = 'active'
                        AND d.deleted_at IS NULL))
               FROM memories m WHERE m.deleted_at IS NULL""").fetchone()
    seconds = round(time.monotonic() - started, 1)
    progress(f"  undistilled share {share:g}: {changed} distillations re-set now ({seconds}s); "
             f"{unheld} of {exchanges} exchanges held by no active distillation")
    return {"requested": share, "exchanges": exchanges, "unheld_exchanges": unheld,
            "unheld_share": round(unheld / exchanges, 4) if exchanges else 0.0, "changed_now": changed,
            "seconds": seconds}


BM25_TRIGGERS = [(table, f"{table}_bm25_{event}") for table in ("memories", "distillations")
                 for event in ("insert", "update", "delete")]


def _unheld(memory_id: uuid.UUID, share: float) -> bool:
    """Whether the exchange ``memory_id`` is in the undistilled ``share``: the first 32 bits of the
    MD5 of its id, below ``share`` × 2³² (:data:`_UNHELD_SQL` is the same rule in SQL)."""
    return int(hashlib.md5(str(memory_id).encode()).hexdigest()[:8], 16) < _share_cut(share)


def _share_cut(share: float) -> int:
    return round(share * 2**32)


_UNHELD_SQL = "('x' || substr(md5(memory_id::text), 1, 8))::bit(32)::bigint < %(cut)s"


def load(url: str, n: int, users: int, seed: int, corpus: RealisticCorpus | None = None,
         undistilled_share: float = 0.0) -> dict:
    """Bulk-load n memories + distillations with COPY (indexes dropped first, rebuilt after).

    The distillations of the exchanges in ``undistilled_share`` (:func:`_unheld`) are loaded in
    review (confidence under the gate), so no active distillation holds those exchanges."""
    from yak_pipeline.store.database import connect

    rng = np.random.default_rng(seed)
    source = corpus.rows(n, rng) if corpus is not None else synthetic_rows(n, rng)
    now = datetime.now(UTC)
    started = time.monotonic()
    rows = []
    with connect(url, autocommit=True) as conn:
        for name in INDEXES:
            conn.execute(f"DROP INDEX IF EXISTS {name}")
        # Exchange contexts (sql/006) are computed once after the load, not row by row by the
        # trigger: the same contexts (a test checks that the two agree), minutes sooner.
        # (sql/018: an INSERT's contexts come from a trigger of their own, per statement.)
        for trigger in ("memories_context", "memories_context_insert"):
            conn.execute(f"ALTER TABLE memories DISABLE TRIGGER {trigger}")
        # Likewise BM25's postings and statistics (sql/013, 014): written once after the load.
        for table, trigger in BM25_TRIGGERS:
            conn.execute(f"ALTER TABLE {table} DISABLE TRIGGER {trigger}")
        with conn.cursor() as cur:
            with cur.copy("COPY memories (id, user_id, content, occurred_at, source, content_sha256, status, "
                          "embedding, embedding_model) FROM STDIN WITH (FORMAT BINARY)") as copy:
                copy.set_types(["uuid", "text", "text", "timestamptz", "text", "text", "text", "vector", "text"])
                for i, (text, content, vector) in enumerate(source):
                    user = f"bench-user-{i % users}"
                    when = now - timedelta(days=float(rng.uniform(0, 365)))
                    memory_id = uuid.uuid4()
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
                    held = not _unheld(memory_id, undistilled_share)
                    copy.write_row([memory_id, user, text, ACTIVE_CONFIDENCE if held else REVIEW_CONFIDENCE,
                                    str(tier), float(rng.uniform(0, 1)), 1.0, "active" if held else "review",
                                    vector, MODEL, "bench", when])
        for trigger in ("memories_context", "memories_context_insert"):
            conn.execute(f"ALTER TABLE memories ENABLE TRIGGER {trigger}")
        conn.execute("SELECT yak_rebuild_exchange_context()")
        for table, trigger in BM25_TRIGGERS:
            conn.execute(f"ALTER TABLE {table} ENABLE TRIGGER {trigger}")
        conn.execute("SELECT yak_bm25_rebuild()")
        # Context vectors (sql/008): the exchange's own vector stands in (synthetic text has no
        # conversation to read), so the fifth leg searches an index of the same size and shape.
        conn.execute("UPDATE memories SET context_embedding = embedding, context_embedding_model = embedding_model")
        progress(f"  loaded {n} distillations in {time.monotonic() - started:.0f}s; building indexes")
        conn.execute("SET maintenance_work_mem = '1GB'")
        for name, sql in INDEXES.items():
            index_started = time.monotonic()
            conn.execute(sql)
            progress(f"  built {name} in {time.monotonic() - index_started:.0f}s")
        # VACUUM as autovacuum would after a bulk load: sets the visibility map that index-only
        # scans (BM25's postings and statistics) rely on.
        for table in ("memories", "distillations", "bm25_postings", "bm25_statistics"):
            conn.execute(f"VACUUM ANALYZE {table}")
    return {"rows": rows, "seconds": round(time.monotonic() - started, 1)}


def build_user_indexes(url: str, *, drop: bool) -> dict:
    """What the nightly ``recall_index_job`` does, timed: fold the BM25 statistics (sql/014) and build
    the per-user HNSW indexes (``store.user_indexes``); with ``drop``, no indexes (any there are
    dropped): the shared index alone."""
    from yak_pipeline.store.bm25 import fold_bm25_statistics
    from yak_pipeline.store.database import connect
    from yak_pipeline.store.user_indexes import describe_build, ensure_user_indexes

    started = time.monotonic()
    with connect(url, autocommit=True) as conn:
        fold_bm25_statistics(conn)
        conn.execute("SET maintenance_work_mem = '1GB'")
        # Not CONCURRENTLY as the job builds them: nothing else runs here, and it is several times faster.
        built = ensure_user_indexes(conn, min_rows=10**12 if drop else USER_INDEX_MIN_ROWS, concurrently=False,
                                    on_build=lambda *build: progress(f"  {describe_build(*build)}"))
        count = conn.execute("SELECT count(*) FROM pg_class WHERE relkind = 'i' AND relname ~ '_u_[0-9a-f]{16}$'"
                             ).fetchone()[0]
    seconds = round(time.monotonic() - started, 1)
    progress(f"  per-user indexes: {len(built)} built in {seconds}s, {count} in all")
    return {"built": len(built), "in_all": count, "seconds": seconds}


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


# The old engine's ranking (``fuse`` of store/hybrid.py, commit 06f3bdf), over the new candidates.
OLD_RRF_K = 1.0
OLD_RELEVANCE_EXPONENT = 6.0
OLD_TEXT_WEIGHT, OLD_VECTOR_WEIGHT, OLD_EXCHANGE_WEIGHT = 1.0, 1.0, 2.0
# The old engine had these four legs (the context-vector leg came later, sql/008).
OLD_LEGS = ("distillation_text", "distillation_vector", "exchange_text", "exchange_vector")
# The old engine's candidate-row query (``_candidate_rows``): the distillation's cosine only.
OLD_CANDIDATE_ROWS_SQL = """SELECT id, 1 - (embedding <=> %s) AS similarity, tier, warmth, user_weight, refreshed_at
           FROM distillations
           WHERE id = ANY(%s::uuid[]) AND status = 'active' AND deleted_at IS NULL AND embedding_model = %s"""


def _old_leg_weight(leg: str) -> float:
    kind = OLD_TEXT_WEIGHT if leg.endswith("_text") else OLD_VECTOR_WEIGHT
    return kind * (OLD_EXCHANGE_WEIGHT if leg.startswith("exchange") else 1.0)


def old_fuse(candidates: list, params, now: datetime) -> list[tuple[str, float, float]]:
    """The old ranking: weighted RRF relevance^6 × decay × (1 + warmth) × gravity; (id, score, relevance), best first."""
    from yak_pipeline.core.scoring import decay_factor, gravity

    best_possible = sum(_old_leg_weight(leg) for leg in OLD_LEGS) / (OLD_RRF_K + 1)
    hits = []
    for candidate in candidates:
        # The old engine dropped an exchange no active distillation held: raw candidates are new.
        if not candidate.ranks or candidate.kind == "raw":
            continue
        fused = sum(_old_leg_weight(leg) / (OLD_RRF_K + rank) for leg, rank in candidate.ranks.items()
                    if leg in OLD_LEGS)
        relevance = (fused / best_possible) ** OLD_RELEVANCE_EXPONENT
        age_days = (now - candidate.refreshed_at).total_seconds() / 86_400.0
        score = (relevance * decay_factor(age_days, params.half_life_days, params.decay_enabled)
                 * (1.0 + candidate.warmth) * gravity(candidate.tier, candidate.user_weight))
        hits.append((candidate.id, score, relevance, candidate.signals.cos_distillation))
    hits.sort(key=lambda h: (-h[1], -h[2], -h[3], h[0]))
    return [(h[0], h[1], h[2]) for h in hits[:params.limit]]


class _TimedConnection:
    """A connection that times, in place, the candidate-row queries it runs (``_CANDIDATE_ROWS_SQL``)
    and the raw candidates' row query (``_RAW_ROWS_SQL``), each on its own."""

    def __init__(self, conn) -> None:
        from yak_pipeline.store.recall import _CANDIDATE_ROWS_SQL, _RAW_ROWS_SQL

        self._conn = conn
        self._sql = {_CANDIDATE_ROWS_SQL: "candidate", _RAW_ROWS_SQL: "raw"}
        self.candidate_ms = 0.0
        self.raw_rows_ms = 0.0
        self.candidate_call: tuple | None = None

    def execute(self, query, params=None, **kwargs):
        which = self._sql.get(query) if isinstance(query, str) else None
        if which is None:
            return self._conn.execute(query, params, **kwargs)
        began = time.perf_counter()
        cursor = self._conn.execute(query, params, **kwargs)  # client-side cursor: rows are fetched here
        if which == "raw":
            self.raw_rows_ms += (time.perf_counter() - began) * 1000
        else:
            self.candidate_ms += (time.perf_counter() - began) * 1000
            self.candidate_call = (query, params)
        return cursor

    def __getattr__(self, name):
        return getattr(self._conn, name)


def _timed_query(conn, query: str, params) -> float:
    began = time.perf_counter()
    conn.execute(query, params).fetchall()
    return (time.perf_counter() - began) * 1000


def _same_top(a: list, b: list) -> bool:
    """Two top-k lists of LegHits are the same ranking: equal scores (to 1e-9), the same rows above
    the last score. Rows of equal score (the realistic corpus repeats turns) may come in either
    order: the two sums add the same terms in different orders, so they differ in the last bits."""
    if len(a) != len(b) or any(abs(x.score - y.score) > 1e-9 for x, y in zip(a, b)):
        return False
    cut = a[-1].score + 1e-9 if a else 0.0
    return {h.id for h in a if h.score > cut} == {h.id for h in b if h.score > cut}


def bench_legs(url: str, queries: list, params) -> dict:
    """Each leg of ``recall_candidates`` on its own, as it runs there, per query (ms): where the time goes."""
    from yak_pipeline.store.bm25 import bm25_search
    from yak_pipeline.store.database import Database
    from yak_pipeline.store.recall import _RAW_ROWS_SQL
    from yak_pipeline.store.recallable_distillations import recallable_distillations
    from yak_pipeline.store.rows import uuid_array
    from yak_pipeline.store.vector_legs import vector_search

    legs: dict[str, list[float]] = {name: [] for name in (
        "bm25 distillations", "bm25 distillations, from the rows (exact)", "bm25 exchanges in context",
        "bm25 exchanges in context, from the rows (exact)", "cosine distillations", "cosine exchanges",
        "cosine contexts", "exchanges -> distillations", "raw exchange rows (queries with any)")}
    same = 0
    size = params.leg_size

    def timed(name: str, call):  # noqa: ANN001, ANN202 - a leg's thunk
        began = time.perf_counter()
        out = call()
        legs[name].append((time.perf_counter() - began) * 1000)
        return out

    with Database(url, max_size=2) as db:
        for user, text, vector in queries:
            with db.connection() as conn:
                # The legs from the postings and from the rows (the reference), alternating which goes first.
                for exact in ((False, True) if len(legs["cosine contexts"]) % 2 else (True, False)):
                    suffix = ", from the rows (exact)" if exact else ""
                    d_text = timed("bm25 distillations" + suffix, lambda: bm25_search(
                        conn, table="distillations", user_id=user, query=text, limit=size, embedding_model=MODEL,
                        exact=exact))
                    m_text = timed("bm25 exchanges in context" + suffix, lambda: bm25_search(
                        conn, table="memories", user_id=user, query=text, limit=size, context=params.exchange_context,
                        exact=exact))
                    if exact:
                        reference = (d_text, m_text)
                    else:
                        postings = (d_text, m_text)
                same += all(_same_top(a, b) for a, b in zip(postings, reference))
                timed("cosine distillations", lambda: vector_search(
                    conn, table="distillations", user_id=user, query_embedding=vector, embedding_model=MODEL, limit=size))
                m_vec = timed("cosine exchanges", lambda: vector_search(
                    conn, table="memories", user_id=user, query_embedding=vector, embedding_model=MODEL, limit=size))
                c_vec = timed("cosine contexts", lambda: vector_search(
                    conn, table="memories", user_id=user, query_embedding=vector, embedding_model=MODEL, limit=size,
                    context=True))
                found = [h.id for h in m_text + m_vec + c_vec]
                held = timed("exchanges -> distillations", lambda: recallable_distillations(
                    conn, user_id=user, memory_ids=found, embedding_model=MODEL))
                unheld = set(found) - held.keys()
                if unheld and params.raw_exchanges:  # as recall_candidates reads them
                    timed("raw exchange rows (queries with any)", lambda: conn.execute(_RAW_ROWS_SQL, {
                        "q": vector, "user": user, "model": MODEL, "as_of": None, "context": params.exchange_context,
                        "ids": uuid_array(sorted(unheld))}).fetchall())
    return {**{name: latency_summary(times) for name, times in legs.items()},
            "bm25 from postings = from the rows (share of queries)": round(same / max(len(queries), 1), 4)}


# The three ways the store pass reads each query's candidates, in each of their six orders in turn.
_VARIANT_ORDERS = list(permutations(("side by side", "raw off", "one by one")))


def bench_store(url: str, queries: list, limit: int, warmup: list) -> dict:
    """Old and new engine on the same candidates (module docstring), and the new engine's fidelity.

    ``warmup`` (other queries than the measured ones) runs first through the new engine, timed on
    its own: right after the load the indexes are not yet in PostgreSQL's buffers. The measured
    pass then sees the steady state of a running server, not the cached answers to its own queries.
    """
    from yak_pipeline.core.query_intent import asks_about_present
    from yak_pipeline.core.recall import rank_memories
    from yak_pipeline.recall_models import load_relevance_model
    from yak_pipeline.services.recall import SPARE_LEG_CONNECTIONS, recall_params, spare_connections
    from yak_pipeline.store.database import Database
    from yak_pipeline.store.recall import recall, recall_candidates
    from yak_pipeline.store.rows import uuid_array

    params = recall_params(get_settings(), threshold=0.7, limit=limit)
    if not params.raw_exchanges:
        progress("  YAK_RECALL_RAW_EXCHANGES is off here: the store pass turns raw candidates on (as shipped)")
        params = replace(params, raw_exchanges=True)
    params_off = replace(params, raw_exchanges=False)
    model = load_relevance_model(MODEL)
    progress(f"  relevance model {model.version}; leg size {params.leg_size}, limit {params.limit}")
    # Room for the spare connections recall's legs run on side by side (services.recall), as a server has.
    with Database(url, max_size=2 + SPARE_LEG_CONNECTIONS) as db:
        first = []
        for user, text, vector in warmup:
            with db.connection(autocommit=True) as conn:
                began = time.perf_counter()
                recall(conn, user_id=user, query=text, query_embedding=vector, embedding_model=MODEL,
                       params=params, model=model, spare=spare_connections(db))
                first.append((time.perf_counter() - began) * 1000)
        progress(f"  store: {len(warmup)} warm-up queries, p95 {latency_summary(first)['p95']} ms")

        legs_ms, one_by_one_ms, in_situ_ms, old_ms, new_ms = [], [], [], [], []
        sql_old_ms, sql_new_ms, counts = [], [], []
        # Raw candidates A/B: the legs without them (a') and the ranking of those candidates (c').
        off_legs_ms, off_rank_ms, off_counts, raw_rows_ms, raw_counts, raw_in_top = [], [], [], [], [], []
        same_top_on_off = 0
        same_new = same_old = same_recall = 0
        measured = []
        for i, (user, text, vector) in enumerate(queries):
            now = datetime.now(UTC)
            # The legs as recall runs them (side by side on spare connections that helper threads
            # borrow, services.recall), the same without raw candidates, and one after another on
            # one connection; each order of the three in turn, so that none always finds another's
            # pages in the buffers (of any two, each goes first in half of the queries).
            for variant in _VARIANT_ORDERS[i % len(_VARIANT_ORDERS)]:
                with db.connection(autocommit=True) as raw:
                    conn = _TimedConnection(raw)
                    began = time.perf_counter()
                    found = recall_candidates(conn, user_id=user, query=text, query_embedding=vector,  # type: ignore[arg-type]
                                              embedding_model=MODEL, params=params_off if variant == "raw off" else params,
                                              spare=[] if variant == "one by one" else spare_connections(db))
                    elapsed = (time.perf_counter() - began) * 1000
                if variant == "side by side":
                    candidates, call = found, conn.candidate_call
                    legs_ms.append(elapsed)
                    in_situ_ms.append(conn.candidate_ms)
                    raw_rows_ms.append(conn.raw_rows_ms)
                elif variant == "raw off":
                    off_candidates = found
                    off_legs_ms.append(elapsed)
                else:
                    one_by_one_ms.append(elapsed)
            counts.append(len(candidates))
            raw_counts.append(sum(c.kind == "raw" for c in candidates))
            off_counts.append(len(off_candidates))
            about_present = asks_about_present(text)
            began = time.perf_counter()
            old = old_fuse(candidates, params, now)
            old_ms.append((time.perf_counter() - began) * 1000)
            # The two rankings in alternating order too (the first may warm the model's caches).
            for raw_on in ((True, False) if i % 2 else (False, True)):
                began = time.perf_counter()
                if raw_on:
                    new = rank_memories(candidates, model=model, params=params, now=now, about_present=about_present)
                    new_ms.append((time.perf_counter() - began) * 1000)
                else:
                    off = rank_memories(off_candidates, model=model, params=params_off, now=now,
                                        about_present=about_present)
                    off_rank_ms.append((time.perf_counter() - began) * 1000)
            raw_in_top.append(sum(m.kind == "raw" for m in new))
            same_top_on_off += [m.id for m in new] == [m.id for m in off]
            # Recall reads the candidate rows in two parts, the second beside the first on a spare
            # connection: the re-runs below read them all at once, on the same arguments (the
            # distillations' ids; a raw candidate's is an exchange's, read by another query).
            ids = sorted(c.id for c in candidates if c.kind == "distilled")
            measured.append((now, old, new, None if call is None else (call[0], {**call[1], "ids": uuid_array(ids)})))

        # Untimed for the engines, in a pass of its own: the two candidate-row queries on the same
        # ids, the exact reference, and recall() itself (it must be a then c). Between the timed
        # recalls, the reference's exact scans (every vector of the user, per leg) would compete
        # with them for shared_buffers, which do not hold the whole database at 100,000 rows.
        for i, ((user, text, vector), (now, old, new, candidate_call)) in enumerate(zip(queries, measured)):
            with db.connection() as c:
                if candidate_call is not None:
                    query, args = candidate_call
                    old_args = (args["q"], args["ids"], MODEL)
                    if i % 2:
                        sql_new_ms.append(_timed_query(c, query, args))
                        sql_old_ms.append(_timed_query(c, OLD_CANDIDATE_ROWS_SQL, old_args))
                    else:
                        sql_old_ms.append(_timed_query(c, OLD_CANDIDATE_ROWS_SQL, old_args))
                        sql_new_ms.append(_timed_query(c, query, args))
                exact = recall_candidates(c, user_id=user, query=text, query_embedding=vector,
                                          embedding_model=MODEL, params=params, exact=True)
                via_recall = recall(c, user_id=user, query=text, query_embedding=vector, embedding_model=MODEL,
                                    params=params, model=model, now=now)
            same_new += [m.id for m in new] == [m.id for m in rank_memories(exact, model=model, params=params, now=now,
                                                                                        about_present=asks_about_present(text))]
            same_old += [h[0] for h in old] == [h[0] for h in old_fuse(exact, params, now)]
            same_recall += [m.id for m in via_recall] == [m.id for m in new]
            if (i + 1) % 100 == 0:
                progress(f"  store: {i + 1}/{len(queries)} queries")

    n = len(queries)
    old_total = [a + b for a, b in zip(legs_ms, old_ms)]
    new_total = [a + c for a, c in zip(legs_ms, new_ms)]
    off_total = [a + c for a, c in zip(off_legs_ms, off_rank_ms)]
    sql_delta = [new - old for new, old in zip(sql_new_ms, sql_old_ms)]
    own_query = ([a - d + b for a, d, b in zip(legs_ms, sql_delta, old_ms)] if len(sql_delta) == n else [])
    return {
        "legs_and_candidates_ms": latency_summary(legs_ms),
        "legs_one_after_another_ms": latency_summary(one_by_one_ms),
        "candidate_row_query_in_situ_ms": latency_summary(in_situ_ms),
        "old_fusion_ms": latency_summary(old_ms),
        "new_ranking_ms": latency_summary(new_ms),
        "old_total_ms": latency_summary(old_total),
        "new_total_ms": latency_summary(new_total),
        "relevance_step_per_query_ms": latency_summary([c - b for b, c in zip(old_ms, new_ms)]),
        "relevance_step_with_sql_per_query_ms": latency_summary(
            [c - b + d for b, c, d in zip(old_ms, new_ms, sql_delta)] if len(sql_delta) == n else []),
        "candidate_rows_sql_old_ms": latency_summary(sql_old_ms),
        "candidate_rows_sql_new_ms": latency_summary(sql_new_ms),
        "candidate_rows_sql_delta_ms": latency_summary(sql_delta),
        "old_total_own_candidate_query_ms": latency_summary(own_query),
        "candidates_per_query": {"mean": round(sum(counts) / n, 1), "max": max(counts), "min": min(counts)},
        "fidelity_new": round(same_new / n, 4),
        "fidelity_old": round(same_old / n, 4),
        "recall_equals_a_then_c": round(same_recall / n, 4),
        "warmup_new_total_ms": latency_summary(first),
        "raw_ab": {
            "raw_on_total_ms": latency_summary(new_total),
            "raw_off_total_ms": latency_summary(off_total),
            "on_minus_off_per_query_ms": latency_summary([a - b for a, b in zip(new_total, off_total)]),
            "raw_on_legs_and_candidates_ms": latency_summary(legs_ms),
            "raw_off_legs_and_candidates_ms": latency_summary(off_legs_ms),
            "legs_on_minus_off_per_query_ms": latency_summary([a - b for a, b in zip(legs_ms, off_legs_ms)]),
            "raw_on_ranking_ms": latency_summary(new_ms),
            "raw_off_ranking_ms": latency_summary(off_rank_ms),
            "raw_rows_query_in_situ_ms": latency_summary(raw_rows_ms),
            "raw_candidates_per_query": {"mean": round(sum(raw_counts) / n, 1), "max": max(raw_counts),
                                         "min": min(raw_counts),
                                         "queries_with_any": round(sum(k > 0 for k in raw_counts) / n, 4)},
            "candidates_per_query_off": {"mean": round(sum(off_counts) / n, 1), "max": max(off_counts),
                                         "min": min(off_counts)},
            f"queries_with_raw_in_top_{params.limit}": round(sum(k > 0 for k in raw_in_top) / n, 4),
            f"raw_in_top_{params.limit}_per_query_mean": round(sum(raw_in_top) / n, 2),
            f"same_top_{params.limit}_on_and_off": round(same_top_on_off / n, 4),
        },
        "legs_ms": bench_legs(url, queries, params),
        "relevance_model": model.version,
        "leg_size": params.leg_size,
    }


def _own_cpu_seconds() -> float:
    """CPU seconds this process has used, every thread of it."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _machine_busy_seconds() -> float | None:
    """CPU seconds the whole machine has been busy (every process, PostgreSQL's too), from /proc/stat."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def bench_cpu(url: str, queries: list, limit: int) -> dict:
    """CPU per recall on the request's path (``services.recall.search_memories``: the query's vector
    beside the text legs, the legs side by side, the relevance step, the memories' rows), one recall
    at a time: the machine's busy time (this process and PostgreSQL's backends) and this process's.

    Whatever runs side by side, a recall cannot take less wall time than its CPU ÷ the cores: the
    floor under the p95 targets (docs/BENCHMARKS.md §2f).
    """
    from yak_pipeline.embeddings.local import LocalMiniLMEmbedder
    from yak_pipeline.recall_models import load_relevance_model
    from yak_pipeline.services.recall import SPARE_LEG_CONNECTIONS, recall_params, search_memories
    from yak_pipeline.store.database import Database

    params = recall_params(get_settings(), threshold=0.7, limit=limit)
    model = load_relevance_model(MODEL)
    embedder = LocalMiniLMEmbedder()
    with Database(url, max_size=2 + SPARE_LEG_CONNECTIONS) as db:
        for user, text, _ in queries[:10]:  # loads the query model, opens the pool's connections
            search_memories(db, embedder, user_id=user, query=text, params=params, model=model)
        busy, own, began = _machine_busy_seconds(), _own_cpu_seconds(), time.perf_counter()
        for user, text, _ in queries:
            search_memories(db, embedder, user_id=user, query=text, params=params, model=model)
        wall, own = time.perf_counter() - began, _own_cpu_seconds() - own
        after = _machine_busy_seconds()
    n, cores = len(queries), os.cpu_count() or 1
    machine = (after - busy) / n * 1000 if busy is not None and after is not None else None
    return {"machine_cpu_ms": round(machine, 2) if machine is not None else None,
            "this_process_cpu_ms": round(own / n * 1000, 2), "wall_ms": round(wall / n * 1000, 2), "cores": cores,
            "floor_ms": round(machine / cores, 2) if machine is not None else None, "queries": n}


def bench_http(url: str, queries: list, limit: int) -> dict:
    """``POST /api/context`` (the target) and ``POST /api/distillations/search`` end to end against a
    real ``yak serve`` process, alternating which goes first."""
    import httpx

    key = secrets.token_urlsafe(24)
    env = {**os.environ, "YAK_DATABASE_URL": url, "YAK_ADMIN_API_KEY": key,
           "YAK_HOME": str(Path(os.environ.get("YAK_HOME", ".yak")).resolve())}
    routes = {"context": "/api/context", "search": "/api/distillations/search"}
    with running_yak("serve", env) as port, httpx.Client(base_url=f"http://127.0.0.1:{port}",
                                                        headers={"X-API-Key": key}, timeout=30) as client:
        for user, text, _ in queries[:20]:  # loads the embedding model, warms the pool
            for route in routes.values():
                client.post(route, json={"query": text, "user_id": user, "limit": limit})
        samples: dict[str, list[float]] = {name: [] for name in routes}
        errors = 0
        for i, (user, text, _) in enumerate(queries):
            for name in (list(routes) if i % 2 else list(routes)[::-1]):
                began = time.perf_counter()
                response = client.post(routes[name], json={"query": text, "user_id": user, "limit": limit})
                samples[name].append((time.perf_counter() - began) * 1000)
                errors += response.status_code != 200
            if (i + 1) % 100 == 0:
                progress(f"  http: {i + 1}/{len(queries)} requests")
        cpu = _http_cpu(client, routes["context"], queries, limit)
    return {"latency_ms": latency_summary(samples["context"]), "search_latency_ms": latency_summary(samples["search"]),
            "errors": errors, "cpu": cpu}


def _http_cpu(client, route: str, queries: list, limit: int) -> dict:  # noqa: ANN001 - httpx.Client
    """CPU per ``route`` request, one request at a time: the machine's busy time (the server and
    PostgreSQL) less this process's own (the client's), and the floor it sets (÷ the cores).

    The floor of the request the HTTP percentiles time, block, profile and framework included,
    where :func:`bench_cpu`'s is the floor of ``search_memories`` alone."""
    busy, own, began = _machine_busy_seconds(), _own_cpu_seconds(), time.perf_counter()
    for user, text, _ in queries:
        client.post(route, json={"query": text, "user_id": user, "limit": limit})
    wall, own = time.perf_counter() - began, _own_cpu_seconds() - own
    after = _machine_busy_seconds()
    n, cores = len(queries), os.cpu_count() or 1
    if busy is None or after is None:
        return {"wall_ms": round(wall / n * 1000, 2), "server_cpu_ms": None, "floor_ms": None, "cores": cores}
    server = ((after - busy) - own) / n * 1000
    return {"wall_ms": round(wall / n * 1000, 2), "server_cpu_ms": round(server, 2), "client_cpu_ms": round(own / n * 1000, 2),
            "floor_ms": round(server / cores, 2), "cores": cores, "queries": n}


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _pcts(lat: dict) -> str:
    return " / ".join(f"{lat[p] + 0.0:g}" for p in ("p50", "p95", "p99"))  # + 0.0: no "-0"


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
    parser.add_argument("--keep", action="store_true", help="keep the scratch database afterwards (its name is printed)")
    add_corpus_options(parser)
    parser.add_argument("--undistilled-share", type=float, default=DEFAULT_UNDISTILLED_SHARE, metavar="SHARE",
                        help="share of the exchanges no active distillation holds (their distillations in review), "
                             "recalled as raw candidates; applied to a --reuse'd database too, idempotently "
                             f"(default {DEFAULT_UNDISTILLED_SHARE:g})")
    parser.add_argument("--no-user-indexes", action="store_true",
                        help="measure without the per-user indexes the nightly recall_index_job builds "
                             "(store.user_indexes): the shared HNSW index alone; drops them from a reused database")
    args = parser.parse_args(argv)
    if args.n < 1 or args.users < 1 or args.queries < 1 or args.users > args.n:
        print("error: --n, --users and --queries must be positive, and --users at most --n", file=sys.stderr)
        return 2
    if not corpus_options_valid(args):
        return 2
    if not 0.0 <= args.undistilled_share <= 1.0:
        print("error: --undistilled-share must be between 0 and 1", file=sys.stderr)
        return 2
    settings = get_settings()
    started = time.monotonic()
    load_average = {"before": _load()}
    with (reused_database(settings, args.reuse) if args.reuse else scratch_database(settings, keep=args.keep)) as url:
        corpus = RealisticCorpus(args.data_dir) if args.corpus == "realistic" else None
        loaded = load_or_reuse(url, args, corpus)
        undistilled = apply_undistilled_share(url, args.undistilled_share)
        user_indexes = build_user_indexes(url, drop=args.no_user_indexes)
        if corpus is not None:
            queries = corpus.queries(args.users, args.queries, args.seed)
            warmup = corpus.queries(args.users, args.queries, args.seed + 1000)
        else:
            queries = _queries(loaded["rows"], args.queries, args.seed)
            warmup = _queries(loaded["rows"], args.queries, args.seed + 1000)
        freeze_heap()
        load_average["store_start"] = _load()
        store = bench_store(url, queries, args.limit, warmup)
        load_average["store_end"] = _load()
        cpu = bench_cpu(url, queries, args.limit)
        http = None if args.no_http else bench_http(url, queries, args.limit)
        load_average["after"] = _load()
    result = {"n": args.n, "users": args.users, "corpus": args.corpus, "queries": args.queries, "limit": args.limit,
              "dimensions": DIM,
              "reused_database": args.reuse, "undistilled": undistilled,
              "load_seconds": loaded["seconds"], "user_indexes": user_indexes, "store": store, "cpu": cpu, "http": http, "targets": TARGETS,
              "load_average_1min": load_average, "seconds": round(time.monotonic() - started, 1)}
    suffix = "_realistic" if args.corpus == "realistic" else ""
    path = write_result(f"recall_latency_n{args.n}_u{args.users}{suffix}", result)
    if args.json:
        import json

        print(json.dumps(result))
        return 0

    def diff(new: dict, old: dict, pct: str) -> str:
        return f"{new[pct] - old[pct]:+.2f}"

    old, new = store["old_total_ms"], store["new_total_ms"]
    step = store["relevance_step_per_query_ms"]
    sql_old, sql_new = store["candidate_rows_sql_old_ms"], store["candidate_rows_sql_new_ms"]
    own = store["old_total_own_candidate_query_ms"]
    cands = store["candidates_per_query"]
    ab = [
        ("(a) legs + candidates: recall_candidates", _pcts(store["legs_and_candidates_ms"]), "", ""),
        ("    the same, legs one after another (no spare connection)", _pcts(store["legs_one_after_another_ms"]), "", ""),
        ("    of which the candidate-row queries on the request's connection", _pcts(store["candidate_row_query_in_situ_ms"]), "", ""),
        *((f"    leg alone: {leg}", _pcts(lat) if isinstance(lat, dict) else str(lat), "", "")
          for leg, lat in store["legs_ms"].items()),
        ("(b) old fusion: weighted RRF (Python)", _pcts(store["old_fusion_ms"]), "", ""),
        ("(c) new ranking: rank_memories (relevance step)", _pcts(store["new_ranking_ms"]), "", ""),
        ("old engine = a + b", _pcts(old), "", ""),
        ("new engine = a + c", _pcts(new), "", ""),
        ("cost of the relevance step = new − old (p50 / p95)",
         f"{diff(new, old, 'p50')} / {diff(new, old, 'p95')}", "", ""),
        ("    per query, c − b (p50 / p95 / p99)", _pcts(step), "", ""),
        ("candidate-row SQL re-run, old: distillation cosine", _pcts(sql_old), "", ""),
        ("candidate-row SQL re-run, new: + exchange cosine join", _pcts(sql_new), "", ""),
        ("    Δ new − old SQL, per query (p50 / p95 / p99)", _pcts(store["candidate_rows_sql_delta_ms"]), "", ""),
        ("old engine with its own candidate query = a − Δ + b", _pcts(own) if own["n"] else "n/a", "", ""),
        ("cost incl. the exchange cosine = new − that (p50 / p95)",
         f"{diff(new, own, 'p50')} / {diff(new, own, 'p95')}" if own["n"] else "n/a", "", ""),
        ("    per query, c − b + Δ (p50 / p95 / p99)",
         _pcts(store["relevance_step_with_sql_per_query_ms"]) if own["n"] else "n/a", "", ""),
        ("candidates per query (mean / min / max)", f"{cands['mean']} / {cands['min']} / {cands['max']}", "", ""),
        ("recall() returns the ids of a then c", f"{store['recall_equals_a_then_c']:.3f}", "1.000",
         verdict(store["recall_equals_a_then_c"], 1.0, higher_is_better=True)),
    ]
    print_table(f"Recall A/B, old engine vs new, N = {args.n}, U = {args.users}, {args.queries} queries "
                f"(ms: p50 / p95 / p99; relevance model {store['relevance_model']}, leg size {store['leg_size']})", ab)
    print("  old = the legs + RRF fusion as store/hybrid.py did it (06f3bdf), without its raw-cosine gate on")
    print("  vector-leg hits; the new candidate query computes both cosines (distillation and exchange) per")
    print("  candidate, the old one the distillation's only: the 'candidate-row SQL' rows time that part.")
    print("  Both engines' (a) is with raw candidates on, as shipped; the old fusion ignores them (it had none).")

    ab_raw = store["raw_ab"]
    on, off = ab_raw["raw_on_total_ms"], ab_raw["raw_off_total_ms"]
    legs_on, legs_off = ab_raw["raw_on_legs_and_candidates_ms"], ab_raw["raw_off_legs_and_candidates_ms"]
    raw_n, top = ab_raw["raw_candidates_per_query"], args.limit
    raw_rows = [
        ("recall, raw candidates on (a + c, as shipped)", _pcts(on), "", ""),
        ("recall, raw candidates off (a' + c')", _pcts(off), "", ""),
        ("cost of the raw candidates = on − off (p50 / p95 / p99)",
         " / ".join(diff(on, off, p) for p in ("p50", "p95", "p99")), "", ""),
        ("    per query, on − off (p50 / p95 / p99)", _pcts(ab_raw["on_minus_off_per_query_ms"]), "", ""),
        ("(a) legs + candidates, on", _pcts(legs_on), "", ""),
        ("(a') legs + candidates, off", _pcts(legs_off), "", ""),
        ("    per query, a − a' (p50 / p95 / p99)", _pcts(ab_raw["legs_on_minus_off_per_query_ms"]), "", ""),
        ("    raw rows query on the request's connection (in a)", _pcts(ab_raw["raw_rows_query_in_situ_ms"]), "", ""),
        ("(c) ranking, on", _pcts(ab_raw["raw_on_ranking_ms"]), "", ""),
        ("(c') ranking, off", _pcts(ab_raw["raw_off_ranking_ms"]), "", ""),
        ("raw candidates per query (mean / min / max)", f"{raw_n['mean']} / {raw_n['min']} / {raw_n['max']}", "", ""),
        ("    queries with any raw candidate (share)", f"{raw_n['queries_with_any']:.3f}", "", ""),
        ("candidates per query, on / off (mean)",
         f"{store['candidates_per_query']['mean']} / {ab_raw['candidates_per_query_off']['mean']}", "", ""),
        (f"queries with a raw memory in the top {top} (share)", f"{ab_raw[f'queries_with_raw_in_top_{top}']:.3f}", "", ""),
        (f"    raw memories in the top {top} per query (mean)", f"{ab_raw[f'raw_in_top_{top}_per_query_mean']:.2f}", "", ""),
        (f"    top {top} the same on and off (share of queries)", f"{ab_raw[f'same_top_{top}_on_and_off']:.3f}", "", ""),
        ("exchanges held by no active distillation: share (count) vs requested",
         f"{undistilled['unheld_share']:.3f} ({undistilled['unheld_exchanges']} of {undistilled['exchanges']})",
         f"{undistilled['requested']:g}", ""),
    ]
    print_table(f"Raw candidates A/B, on vs off, same queries and vectors, N = {args.n}, U = {args.users} "
                f"(ms: p50 / p95 / p99)", raw_rows)

    rows = [
        ("store, new engine (a + c) p50 / p95 / p99 ms", _pcts(new), f"p95 ≤ {TARGETS['store_p95_ms']:g}",
         verdict(new["p95"], TARGETS["store_p95_ms"], higher_is_better=False)),
        ("store, old engine (a + b) p50 / p95 / p99 ms", _pcts(old), f"p95 ≤ {TARGETS['store_p95_ms']:g}",
         verdict(old["p95"], TARGETS["store_p95_ms"], higher_is_better=False)),
        (f"store fidelity, new (top-{args.limit}: exact=False = exact=True)", f"{store['fidelity_new']:.3f}",
         f"≥ {TARGETS['fidelity']}", verdict(store["fidelity_new"], TARGETS["fidelity"], higher_is_better=True)),
        ("  (old ranking's fidelity, same candidates)", f"{store['fidelity_old']:.3f}", "", ""),
        (f"  (new engine, first {args.queries} after the load: p50 / p95 ms)",
         f"{store['warmup_new_total_ms']['p50']} / {store['warmup_new_total_ms']['p95']}", "", ""),
    ]
    if http:
        lat = http["latency_ms"]
        rows.append(("HTTP /api/context p50 / p95 / p99 ms", _pcts(lat), f"p95 ≤ {TARGETS['http_p95_ms']:g}",
                     verdict(lat["p95"], TARGETS["http_p95_ms"], higher_is_better=False)))
        rows.append(("  (HTTP /api/distillations/search p50 / p95 / p99 ms)", _pcts(http["search_latency_ms"]), "", ""))
        rows.append(("  (HTTP errors)", str(http["errors"]), "0", verdict(-http["errors"], 0, higher_is_better=True)))
    rows.append(("CPU per recall, request path: machine / this process ms",
                 f"{cpu['machine_cpu_ms']} / {cpu['this_process_cpu_ms']}", "", ""))
    rows.append((f"  wall per recall, one at a time / floor = CPU ÷ {cpu['cores']} cores (ms)",
                 f"{cpu['wall_ms']} / {cpu['floor_ms']}", "", ""))
    if http and cpu["floor_ms"]:
        ratio = http["latency_ms"]["p95"] / cpu["floor_ms"]
        rows.append(("HTTP /api/context p95 ÷ that floor (search_memories' CPU)", f"{ratio:.2f}",
                     f"≤ {TARGETS['http_p95_over_floor']:g}",
                     verdict(ratio, TARGETS["http_p95_over_floor"], higher_is_better=False)))
    if http and http["cpu"]["floor_ms"]:
        hc = http["cpu"]
        rows.append(("CPU per HTTP /api/context, one at a time: server and PostgreSQL / client ms",
                     f"{hc['server_cpu_ms']} / {hc['client_cpu_ms']}", "", ""))
        rows.append((f"  wall per request / floor = that CPU ÷ {hc['cores']} cores (ms)",
                     f"{hc['wall_ms']} / {hc['floor_ms']}", "", ""))
        ratio = http["latency_ms"]["p95"] / hc["floor_ms"]
        rows.append(("HTTP /api/context p95 ÷ the request's own floor", f"{ratio:.2f}",
                     f"≤ {TARGETS['http_p95_over_floor']:g}",
                     verdict(ratio, TARGETS["http_p95_over_floor"], higher_is_better=False)))
    rows.append(("load avg 1 min (start / store / store end / end)",
                 " / ".join(str(load_average[k]) for k in ("before", "store_start", "store_end", "after")), "", ""))
    rows.append(("per-user indexes (built now / in all / build s)",
                 f"{user_indexes['built']} / {user_indexes['in_all']} / {user_indexes['seconds']}", "", ""))
    print_table(f"Recall latency, N = {args.n}, U = {args.users} (targets are for N = 100,000, U = 10)", rows)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
