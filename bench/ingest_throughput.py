"""Ingest throughput: ``python bench/ingest_throughput.py --n 1000 [--llm-n 100] [--json]``.

0. **The machine's limit** — what the configured embedder alone does on this machine: the texts an
   exchange costs (its distillation, itself, itself read with its neighbours), embedded in
   batches from one thread per core, in documents/s, at the best of a few batch sizes (16, 32
   and 64: which is best changes from run to run by up to a tenth on the 2-core development
   machine, 141 documents/s for 16 against 129 for 64 in one series, 126 against 130 in another). Divided by the texts ``yak process``
   embedded per exchange (its ``documents_embedded``), it is the exchanges/s no pipeline on this
   machine can pass; ingest is printed as a share of it (``share_of_limit``), a figure that holds
   on any machine where the absolute rate does not.
1. **Offline, ``yak process``** — N exchanges in a ``.jsonl`` file in the drop folder of a scratch
   home, then ``yak process --json`` in a subprocess (rules provider, local embedder, a scratch
   database): exchanges/s over the command's wall time, start-up included.
2. **Per stage** — the same pipeline functions ``yak process`` runs, called in-process on another
   N exchanges, each timed: ingest, distil (LLM + embed + gate), conflict scores, near-duplicate
   merges, exchange vectors.
3. **LLM-bound** — distillation through the loopback OpenAI-protocol server (the test suite's
   ``FakeOpenAIServer``, real HTTP, real ``openai`` client) answering every call after 200 ms,
   at concurrency 1 and 10 (``YAK_LLM_CONCURRENCY``): exchanges/s and the speed-up. Then the
   conflict checks of ``CONFLICT_N`` distillations (distilled offline first), every conflict
   call answered after 200 ms, at concurrency 1 and 10: distillations checked per second.

Targets (issue 37): ``yak process`` at ≥ 60 % of the limit measured in the same run; ≥ 7× speed-up at
concurrency 10.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, print_table, progress, scratch_database, verdict, write_result  # noqa: E402

from yak_pipeline.settings import Settings, get_settings  # noqa: E402

TARGETS = {"share_of_limit": 0.6, "concurrency_speedup": 7.0}
# The batch sizes the limit is measured at; the best is the limit.
LIMIT_BATCHES = (16, 32, 64)
LLM_DELAY_SECONDS = 0.2
# Distillations whose conflict checks go through the 200 ms LLM (about five calls each, one after
# another at concurrency 1: this many keep that run near half a minute).
CONFLICT_N = 30
_OPENERS = ["I", "My sister", "We", "I really", "Last week I", "My partner and I"]
_ACTS = ["moved to Lisbon", "adopted a kitten called Miso", "started learning the violin", "work as a nurse",
         "ran a half marathon", "bake sourdough on Sundays", "visited the science museum", "prefer green tea",
         "am allergic to peanuts", "planted tomatoes in the garden", "booked a trip to Tokyo", "joined a chess club"]


def exchanges(n: int, seed: int, user_prefix: str = "bench") -> list[dict]:
    """n varied exchanges over 5 users and 10 days, in the drop-folder JSON form."""
    rng = np.random.default_rng(seed)
    start = datetime.now(UTC) - timedelta(days=10)
    out = []
    for i in range(n):
        said = f"{rng.choice(_OPENERS)} {rng.choice(_ACTS)}, and {rng.choice(_OPENERS).lower()} {rng.choice(_ACTS)} ({i})."
        out.append({"user_id": f"{user_prefix}-{i % 5}", "user": said, "assistant": "Good to know!",
                    "occurred_at": (start + timedelta(hours=int(rng.integers(0, 240)))).isoformat()})
    return out


def bench_limit(settings: Settings, n: int, seed: int) -> dict:
    """The configured embedder's documents/s on this machine, in batches of each of ``LIMIT_BATCHES``
    sizes from one thread per core, over the texts n exchanges cost: each one's distillation (the
    rules distiller's), its own text, and its text between its neighbours (sql/006's context). The
    best batch size's figure is the limit."""
    from yak_pipeline.embeddings import get_embedder
    from yak_pipeline.llm.rules import RulesProvider

    contents = [f"User: {e['user']}\nAssistant: {e['assistant']}" for e in exchanges(n, seed + 2, user_prefix="limit")]
    rules = RulesProvider()
    texts = [rules.distill(c).content for c in contents] + contents
    texts += ["\n".join(contents[max(i - 1, 0):i + 2]) for i in range(len(contents))]
    embedder = get_embedder(settings)
    embedder.embed_documents(["warm up"] * max(LIMIT_BATCHES))  # model loading is start-up, not throughput
    cores = os.cpu_count() or 1
    by_batch: dict[int, float] = {}
    seconds: dict[int, float] = {}
    for size in LIMIT_BATCHES:
        batches = [texts[i:i + size] for i in range(0, len(texts), size)]
        began = time.monotonic()
        with ThreadPoolExecutor(max_workers=cores) as pool:
            done = sum(len(v) for v in pool.map(embedder.embed_documents, batches))
        seconds[size] = time.monotonic() - began
        by_batch[size] = round(done / seconds[size], 1)
    best = max(by_batch, key=lambda size: by_batch[size])
    return {"embedder": embedder.model_name, "documents": len(texts), "batch": best, "threads": cores,
            "seconds": round(seconds[best], 2), "documents_per_s": by_batch[best],
            "documents_per_s_by_batch": {str(size): v for size, v in by_batch.items()}}


def bench_yak_process(settings: Settings, url: str, n: int, seed: int) -> dict:
    """``yak process --json`` over one dropped file of n exchanges, as a subprocess."""
    with tempfile.TemporaryDirectory(prefix="yak-bench-") as home:
        drop = Path(home) / "drop"
        drop.mkdir()
        (drop / "bench.jsonl").write_text("\n".join(json.dumps(e) for e in exchanges(n, seed)) + "\n")
        env = {**os.environ, "YAK_HOME": home, "YAK_DATABASE_URL": url, "YAK_DROP_DIR": str(drop)}
        env.pop("YAK_LLM_BASE_URL", None)
        began, cpu_before = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run([sys.executable, "-m", "yak_pipeline.cli.main", "process", "--json"], env=env,
                              capture_output=True, text=True, cwd=ROOT)
        seconds = time.monotonic() - began
        cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"yak process failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    report = json.loads(done.stdout)
    # The command's own CPU time (PostgreSQL's not included): on a machine other work loads, wall
    # time moves with that load; CPU time much less, so it tells a change's cost apart from the load.
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    return {"exchanges": n, "seconds": round(seconds, 2), "exchanges_per_s": round(n / seconds, 1),
            "cpu_seconds": round(cpu, 1),
            "partitions": len(report["partitions"]), "documents_embedded": report["documents_embedded"],
            "texts_per_exchange": round(report["documents_embedded"] / n, 2), "assets": report["assets"]}


def bench_stages(settings: Settings, url: str, n: int, seed: int) -> dict:
    """The pipeline's functions in-process, each stage timed, over n exchanges."""
    from yak_pipeline.embeddings import get_embedder
    from yak_pipeline.ingestion.formats.exchange_records import ExchangeRecord
    from yak_pipeline.ingestion.records import ingest_records
    from yak_pipeline.llm import get_llm_provider
    from yak_pipeline.services.consolidate import ConsolidateJob, merge_near_duplicates, score_conflicts
    from yak_pipeline.services.distill import DistillJob, distill_memories, partition_memory_ids
    from yak_pipeline.services.exchange_embeddings import embed_pending_exchanges
    from yak_pipeline.wiring import open_database

    embedder = get_embedder(settings)
    embedder.embed_query("warm up")  # model loading is start-up, not throughput
    llm = get_llm_provider(settings)
    seconds: dict[str, float] = {}
    records = [ExchangeRecord(user_id=e["user_id"], content=f"User: {e['user']}\nAssistant: {e['assistant']}",
                              occurred_at=datetime.fromisoformat(e["occurred_at"]), line=i)
               for i, e in enumerate(exchanges(n, seed + 1, user_prefix="stage"))]
    with open_database(settings, url=url, max_size=settings.llm_concurrency + 2) as db:
        began = time.monotonic()
        ingest_records(db, records, source="import")
        seconds["ingest"] = time.monotonic() - began
        users = sorted({r.user_id for r in records})
        job = DistillJob(db=db, llm=llm, embedder=embedder, prompt_version=settings.prompt_version)
        consolidate = ConsolidateJob(db=db, llm=llm, embedder=embedder)
        for stage in ("distill", "conflicts", "merge", "exchange_vectors"):
            began = time.monotonic()
            for user in users:
                if stage == "distill":
                    ids = partition_memory_ids(db, user_id=user, day=None, include_outdated=False,
                                               prompt_version=settings.prompt_version)
                    distill_memories(job, ids, concurrency=settings.llm_concurrency)
                elif stage == "conflicts":
                    score_conflicts(consolidate, user_id=user, day=None)
                elif stage == "merge":
                    merge_near_duplicates(consolidate, user_id=user, day=None)
                else:
                    embed_pending_exchanges(db, embedder, user_id=user)
            seconds[stage] = time.monotonic() - began
            progress(f"  stage {stage}: {seconds[stage]:.1f}s")
    total = sum(seconds.values())
    return {"exchanges": n, "llm_provider": llm.name, "embedder": embedder.model_name,
            "seconds": {k: round(v, 2) for k, v in seconds.items()}, "total_seconds": round(total, 2),
            "exchanges_per_s": round(n / total, 1),
            "share": {k: round(v / total, 3) for k, v in seconds.items()}}


def _stored_for(settings: Settings, db, user: str, items: list[dict]) -> list[str]:  # noqa: ANN001 - Database
    """``items`` (:func:`exchanges`) stored as ``user``'s exchanges; the ids of their memories to distil."""
    from yak_pipeline.ingestion.formats.exchange_records import ExchangeRecord
    from yak_pipeline.ingestion.records import ingest_records
    from yak_pipeline.services.distill import partition_memory_ids

    ingest_records(db, [ExchangeRecord(user_id=user, content=f"User: {e['user']}\nAssistant: {e['assistant']}",
                                       occurred_at=datetime.fromisoformat(e["occurred_at"]), line=i)
                        for i, e in enumerate(items)], source="import")
    return partition_memory_ids(db, user_id=user, day=None, include_outdated=False,
                                prompt_version=settings.prompt_version)


def bench_llm_concurrency(settings: Settings, url: str, n: int, seed: int) -> dict:
    """Distillation through a loopback OpenAI-protocol server that answers after 200 ms."""
    from yak_loopback.openai_replies import Reply
    from yak_loopback.openai_server import FakeOpenAIServer
    from yak_pipeline.embeddings import get_embedder
    from yak_pipeline.llm import OpenAIChatProvider
    from yak_pipeline.services.distill import DistillJob, distill_memories
    from yak_pipeline.wiring import open_database

    embedder = get_embedder(settings)
    embedder.embed_query("warm up")
    results = {}
    with FakeOpenAIServer() as server:
        llm_settings = settings.model_copy(update={"llm_base_url": server.base_url, "llm_model": "fake-model"})
        llm = OpenAIChatProvider.from_settings(llm_settings)
        with open_database(settings, url=url, max_size=12) as db:
            for concurrency in (1, 10):
                ids = _stored_for(settings, db, f"llm-c{concurrency}", exchanges(n, seed + concurrency, user_prefix="x"))
                job = DistillJob(db=db, llm=llm, embedder=embedder, prompt_version=settings.prompt_version)
                # One delayed answer per distillation call; each then answers like a good model.
                server.script(*[Reply.delay(LLM_DELAY_SECONDS)] * len(ids))
                began = time.monotonic()
                report = distill_memories(job, ids, concurrency=concurrency)
                seconds = time.monotonic() - began
                results[str(concurrency)] = {"exchanges": len(ids), "distilled": report.rows_out,
                                             "seconds": round(seconds, 2),
                                             "exchanges_per_s": round(len(ids) / seconds, 2)}
                progress(f"  concurrency {concurrency}: {len(ids)} exchanges in {seconds:.1f}s")
            conflicts = _llm_conflict_checks(settings, db, llm, embedder, seed, server)
    speedup = results["10"]["exchanges_per_s"] / results["1"]["exchanges_per_s"]
    return {"delay_seconds": LLM_DELAY_SECONDS, "by_concurrency": results, "speedup": round(speedup, 2),
            "conflict_checks": conflicts}


def _llm_conflict_checks(settings: Settings, db, llm, embedder, seed: int, server) -> dict:  # noqa: ANN001
    """The conflict checks of :data:`CONFLICT_N` distillations, each LLM call answered after 200 ms,
    at concurrency 1 and 10 (one user each, distilled offline by the rules first)."""
    from yak_loopback.openai_replies import Reply
    from yak_pipeline.llm.rules import RulesProvider
    from yak_pipeline.services.consolidate import ConsolidateJob, score_conflicts
    from yak_pipeline.services.distill import DistillJob, distill_memories

    by_concurrency = {}
    for concurrency in (1, 10):
        user = f"conflicts-c{concurrency}"
        ids = _stored_for(settings, db, user, exchanges(CONFLICT_N, seed, user_prefix="c"))
        distill_memories(DistillJob(db=db, llm=RulesProvider(), embedder=embedder,
                                    prompt_version=settings.prompt_version), ids, concurrency=2)
        # Every call delayed: more delayed replies than calls (a leftover only delays a later call).
        server.script(*[Reply.delay(LLM_DELAY_SECONDS)] * (10 * CONFLICT_N))
        began = time.monotonic()
        report = score_conflicts(ConsolidateJob(db=db, llm=llm, embedder=embedder, concurrency=concurrency),
                                 user_id=user, day=None)
        seconds = time.monotonic() - began
        by_concurrency[str(concurrency)] = {"distillations": report.rows_out, "llm_calls": len(report.latencies_ms),
                                            "conflicts": report.flagged, "seconds": round(seconds, 2),
                                            "distillations_per_s": round(report.rows_out / seconds, 2)}
        progress(f"  conflict checks at concurrency {concurrency}: {report.rows_out} distillations, "
                 f"{len(report.latencies_ms)} calls in {seconds:.1f}s")
    speedup = by_concurrency["10"]["distillations_per_s"] / by_concurrency["1"]["distillations_per_s"]
    return {"by_concurrency": by_concurrency, "speedup": round(speedup, 2)}


def main(argv: list[str] | None = None) -> int:
    """Run the three measurements and print (or emit as JSON) the figures next to the targets."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="exchanges for the offline runs (default 1000)")
    parser.add_argument("--llm-n", type=int, default=100, help="exchanges per LLM-bound run (default 100)")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    if args.n < 1 or args.llm_n < 1:
        print("error: --n and --llm-n must be positive", file=sys.stderr)
        return 2
    settings = get_settings()
    progress(f"the embedder's limit: the texts of {min(args.n, 300)} exchanges in batches of "
             f"{', '.join(str(b) for b in LIMIT_BATCHES)}")
    limit = bench_limit(settings, min(args.n, 300), args.seed)
    progress("  " + ", ".join(f"{v} documents/s in batches of {b}" for b, v in limit["documents_per_s_by_batch"].items()))
    load = {"before": round(os.getloadavg()[0], 2)}
    with scratch_database(settings) as url:
        progress(f"yak process over {args.n} dropped exchanges")
        process = bench_yak_process(settings, url, args.n, args.seed)
        progress(f"  {process['exchanges_per_s']} exchanges/s, {process['texts_per_exchange']} texts embedded each")
        progress(f"pipeline stages in-process over {args.n} exchanges")
        stages = bench_stages(settings, url, args.n, args.seed)
        progress(f"LLM-bound distillation, {args.llm_n} exchanges, 200 ms per call")
        llm = bench_llm_concurrency(settings, url, args.llm_n, args.seed)
    load["after"] = round(os.getloadavg()[0], 2)
    # What no pipeline can pass here: the embedder's documents/s over the texts each exchange costs.
    limit["exchanges_per_s"] = round(limit["documents_per_s"] / max(process["texts_per_exchange"], 1e-9), 1)
    share = process["exchanges_per_s"] / limit["exchanges_per_s"]
    result = {"limit": limit, "yak_process": process, "share_of_limit": round(share, 3), "stages": stages,
              "llm": llm, "targets": TARGETS, "load_average_1min": load}
    path = write_result(f"ingest_throughput_n{args.n}", result)
    if args.json:
        print(json.dumps(result))
        return 0
    rows = [
        (f"embedder alone, best of batches of {', '.join(str(b) for b in LIMIT_BATCHES)} "
         f"(best: {limit['batch']}) on {limit['threads']} threads (documents/s)",
         f"{limit['documents_per_s']}", "", ""),
        ("texts embedded per exchange by yak process", f"{process['texts_per_exchange']}", "", ""),
        ("the limit: documents/s ÷ texts per exchange (exchanges/s)", f"{limit['exchanges_per_s']}", "", ""),
        ("yak process, offline (exchanges/s, start-up included)", f"{process['exchanges_per_s']}", "", ""),
        ("yak process's own CPU time (s)", f"{process['cpu_seconds']}", "", ""),
        ("yak process as a share of the limit", f"{share:.0%}", f"≥ {TARGETS['share_of_limit']:.0%}",
         verdict(share, TARGETS["share_of_limit"], higher_is_better=True)),
        ("pipeline functions in-process (exchanges/s)", f"{stages['exchanges_per_s']}", "", ""),
    ]
    rows += [(f"  stage {k} (s, share)", f"{v} ({stages['share'][k]:.0%})", "", "")
             for k, v in stages["seconds"].items()]
    for c, figures in llm["by_concurrency"].items():
        rows.append((f"LLM at 200 ms/call, concurrency {c} (exchanges/s)", f"{figures['exchanges_per_s']}", "", ""))
    rows.append(("speed-up at concurrency 10", f"{llm['speedup']}×", f"≥ {TARGETS['concurrency_speedup']:g}×",
                 verdict(llm["speedup"], TARGETS["concurrency_speedup"], higher_is_better=True)))
    for c, figures in llm["conflict_checks"]["by_concurrency"].items():
        rows.append((f"conflict checks, LLM at 200 ms/call, concurrency {c} (distillations/s; calls)",
                     f"{figures['distillations_per_s']}; {figures['llm_calls']}", "", ""))
    rows.append(("conflict checks' speed-up at concurrency 10", f"{llm['conflict_checks']['speedup']}×", "", ""))
    rows.append(("load average, 1 min (before / after)", f"{load['before']} / {load['after']}", "", ""))
    print_table("Ingest throughput", rows)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
