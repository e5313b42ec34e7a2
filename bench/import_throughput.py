"""History import throughput: ``python bench/import_throughput.py [--n 5000] [--vectors] [--json]``.

Writes a ChatGPT data export of N exchanges (``conversations.json`` in the export's zip, in a
scratch folder): conversations of 10 exchanges, each a ``mapping`` tree with what real exports
carry besides the exchanges (a hidden system message, an edited prompt's abandoned branch, a
tool call and its output per conversation). Then, on a scratch database:

1. **parse** — :func:`parse_history_file` on the zip, in-process (unzip, JSON, branch walking);
2. **yak import** — ``yak import export.zip --user bench --json`` in a subprocess, wall time
   with start-up (``first_import_exchanges_per_s``; issue 37 sets >= 200/s at 5,000). The
   moment it returns, one exchange in the middle of the export is searched for by its words
   through both BM25 legs of recall (the exchange alone, and in its conversation context): the
   import must be searchable then (``searchable_at_return``);
3. the vectors: ``yak import`` leaves them to a background worker (``cli/import_vectors.py``).
   With ``--vectors`` the bench waits for it (polling the count ``yak queue status`` shows) and
   reports its rate; without, it stops that worker (by the pid ``yak import --json`` names),
   so the re-import is not timed beside it;
4. **yak import again** — every exchange found already there (``already_stored``).

The load average is printed before and after: other work on the machine slows every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, print_table, progress, scratch_database, verdict, write_result  # noqa: E402

from yak_pipeline.settings import get_settings  # noqa: E402

EXCHANGES_PER_CONVERSATION = 10
_TOPICS = ["my sourdough starter", "the trip to Kyoto", "learning Spanish", "my knee after long runs",
           "the bakery's opening hours", "my sister Ana's wedding", "tomatoes in the garden", "a chess opening"]


def _message(node_id: str, role: str, when: float, text: str, **extra: object) -> dict:
    return {"id": node_id, "author": {"role": role, "name": None, "metadata": {}}, "create_time": when,
            "update_time": None, "content": {"content_type": "text", "parts": [text]},
            "status": "finished_successfully", "end_turn": role == "assistant", "weight": 1.0,
            "metadata": extra.pop("metadata", {}), "recipient": extra.pop("recipient", "all"), **extra}


def conversation(index: int, start: float) -> dict:
    """One conversation of :data:`EXCHANGES_PER_CONVERSATION` exchanges on its current branch."""
    mapping: dict[str, dict] = {}

    def add(node_id: str, parent: str | None, message: dict | None) -> None:
        mapping[node_id] = {"id": node_id, "message": message, "parent": parent, "children": []}
        if parent is not None:
            mapping[parent]["children"].append(node_id)

    add("root", None, None)
    add("sys", "root", _message("sys", "system", None, "", metadata={"is_visually_hidden_from_conversation": True}))
    parent, when = "sys", start
    topic = _TOPICS[index % len(_TOPICS)]
    for turn in range(EXCHANGES_PER_CONVERSATION):
        if turn == 1:  # an edited prompt leaves its first version on a side branch
            add(f"u{turn}-old", parent, _message(f"u{turn}-old", "user", when, f"(first draft) about {topic}?"))
        add(f"u{turn}", parent, _message(f"u{turn}", "user", when, f"Conversation {index}, question {turn} about {topic}: "
                                                                   f"what should I do next, given step {turn}?"))
        parent = f"u{turn}"
        if turn == 2:  # a tool call and its output between the prompt and the answer
            add(f"t{turn}", parent, _message(f"t{turn}", "assistant", when + 1, "search(...)", recipient="browser"))
            add(f"o{turn}", f"t{turn}", _message(f"o{turn}", "tool", when + 2, "results ..."))
            parent = f"o{turn}"
        add(f"a{turn}", parent, _message(f"a{turn}", "assistant", when + 5,
                                         f"For {topic}, step {turn} of conversation {index}: keep it simple and "
                                         f"write down what worked ({index}.{turn})."))
        parent, when = f"a{turn}", when + 60
    return {"title": f"About {topic} ({index})", "create_time": start, "update_time": when, "mapping": mapping,
            "current_node": parent, "conversation_id": f"bench-{index:06d}", "id": f"bench-{index:06d}",
            "moderation_results": [], "default_model_slug": "gpt-4o"}


def write_export(folder: Path, n: int) -> Path:
    """A ChatGPT export zip of ``n`` exchanges (rounded up to whole conversations)."""
    count = -(-n // EXCHANGES_PER_CONVERSATION)
    start = time.time() - 400 * 86400
    conversations = [conversation(i, start + i * 3600) for i in range(count)]
    path = folder / "chatgpt-export.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("conversations.json", json.dumps(conversations))
        archive.writestr("user.json", json.dumps({"id": "user-bench"}))
    return path


def _yak_import(export: Path, env: dict[str, str]) -> tuple[dict, dict]:
    """One ``yak import --json`` in a subprocess: its wall time and counts, and its totals."""
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "yak_pipeline.cli.main", "import", str(export), "--user", "bench",
                           "--json"], env=env, capture_output=True, text=True, cwd=ROOT)
    seconds = time.monotonic() - began
    if done.returncode != 0:
        raise RuntimeError(f"yak import failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    totals = json.loads(done.stdout)["totals"]
    return {"seconds": round(seconds, 2), "stored": totals["exchanges"],
            "already_stored": totals["already_stored"]}, totals


def searchable(url: str, conversations: int) -> dict:
    """Whether one exchange in the middle of the export is found by its words, by each BM25 leg of recall."""
    from yak_pipeline.store.bm25 import bm25_search
    from yak_pipeline.store.database import connect

    index, turn = conversations // 2, 7
    # Words only that exchange holds together (its conversation's number, the step, the topic).
    query = f"Conversation {index}, question {turn} about {_TOPICS[index % len(_TOPICS)]}"
    began = time.monotonic()
    with connect(url) as conn:
        target = conn.execute("SELECT id FROM memories WHERE user_id = 'bench' AND content LIKE %s",
                              (f"User: {query}:%",)).fetchone()
        legs = {name: [h.id for h in bm25_search(conn, table="memories", user_id="bench", query=query, limit=10,
                                                 context=context)]
                for name, context in (("exchange", False), ("exchange_in_context", True))}
    found = {name: target is not None and str(target[0]) in map(str, ids) for name, ids in legs.items()}
    return {"query": query, "found_by": found, "seconds": round(time.monotonic() - began, 3)}


def wait_for_vectors(url: str, pid: int, total: int) -> dict:
    """Wait until no exchange lacks its vectors (the count ``yak queue status`` shows); the time it took."""
    from yak_pipeline.store.database import connect
    from yak_pipeline.store.queue import queue_counts

    began = time.monotonic()
    while True:
        with connect(url) as conn:
            left = queue_counts(conn, user_id="bench").unembedded_memories
        if left == 0:
            break
        progress(f"vectors: {total - left}/{total} exchanges done ({time.monotonic() - began:.0f}s)")
        time.sleep(5)
    seconds = time.monotonic() - began
    return {"seconds": round(seconds, 1), "exchanges_per_s": round(total / seconds, 1), "worker_pid": pid}


def stop_worker(pid: int) -> None:
    """Stop the background vectors worker the import started (by its pid; gone already is fine)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def bench_import(url: str, export: Path, home: str, *, vectors: bool, conversations: int) -> dict:
    """``yak import`` twice in a subprocess: the first stores everything (searchable when it returns),
    the second finds it all; between them the background vectors are waited for or stopped."""
    # The configured embedder (the scratch database was migrated for it); its own home and drop folder.
    env = {**os.environ, "YAK_HOME": home, "YAK_DATABASE_URL": url, "YAK_DROP_DIR": str(Path(home) / "drop")}
    first, totals = _yak_import(export, env)
    found = searchable(url, conversations)
    pid = (totals.get("vectors") or {}).get("background_pid")
    followed = None
    if pid is not None:
        if vectors:
            followed = wait_for_vectors(url, pid, first["stored"])
        else:
            stop_worker(pid)
            followed = {"worker_pid": pid, "stopped": True}
    again, _ = _yak_import(export, env)
    return {"first": first, "again": again, "searchable": found, "vectors": followed}


def main() -> None:
    """Run the benchmark and print (or ``--json``) the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000, help="Exchanges in the export.")
    parser.add_argument("--vectors", action="store_true",
                        help="Wait for the background vectors after the first import and report their rate.")
    parser.add_argument("--json", action="store_true", help="Print the result as JSON.")
    args = parser.parse_args()
    from yak_pipeline.ingestion.formats.history_files import parse_history_file

    settings = get_settings()
    with tempfile.TemporaryDirectory(prefix="yak-bench-import-") as folder:
        export = write_export(Path(folder), args.n)
        size = export.stat().st_size
        progress(f"export: {size / 1e6:.1f} MB zip")
        began = time.monotonic()
        parsed = parse_history_file(export.name, export.read_bytes(), user_id="bench")
        parse_seconds = time.monotonic() - began
        exchanges = len(parsed.records)
        progress(f"parsed {exchanges} exchanges in {parse_seconds:.2f}s")
        load_before = os.getloadavg()
        progress(f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}")
        with scratch_database(settings) as url:
            imported = bench_import(url, export, str(Path(folder) / "home"), vectors=args.vectors,
                                    conversations=-(-args.n // EXCHANGES_PER_CONVERSATION))
        load_after = os.getloadavg()
        progress(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    first, again = imported["first"], imported["again"]
    result = {
        "exchanges": exchanges, "export_bytes": size,
        "parse_seconds": round(parse_seconds, 2), "parse_exchanges_per_s": round(exchanges / parse_seconds, 1),
        "import": first, "first_import_exchanges_per_s": round(first["stored"] / first["seconds"], 1),
        "searchable_at_return": all(imported["searchable"]["found_by"].values()),
        "search_at_return": imported["searchable"],
        "vectors": imported["vectors"],
        "reimport": again, "reimport_exchanges_per_s": round(exchanges / again["seconds"], 1),
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in load_after]},
    }
    path = write_result(f"import_throughput_n{args.n}", result)
    if args.json:
        print(json.dumps(result))
        return
    rate = result["first_import_exchanges_per_s"]
    rows = [
        ("parse (in-process)", f"{result['parse_exchanges_per_s']:.0f} exchanges/s", "", ""),
        ("yak import (wall, start-up included)", f"{rate:.0f} exchanges/s ({first['seconds']:.1f}s)", ">= 200/s",
         verdict(rate, 200, higher_is_better=True)),
        ("searchable by its words when it returns", ", ".join(
            f"{leg}: {'found' if ok else 'NOT found'}" for leg, ok in result["search_at_return"]["found_by"].items()),
         "found", "met" if result["searchable_at_return"] else "missed"),
        ("yak import again (adds nothing)", f"{result['reimport_exchanges_per_s']:.0f} exchanges/s "
         f"({again['stored']} new)", "", ""),
    ]
    if result["vectors"] and not result["vectors"].get("stopped"):
        rows.append(("vectors, in the background", f"{result['vectors']['exchanges_per_s']:.1f} exchanges/s "
                     f"({result['vectors']['seconds']:.0f}s)", "", ""))
    print_table(f"History import: a {exchanges}-exchange ChatGPT export ({path.relative_to(ROOT)}; load average "
                f"{load_before[0]:.1f} before, {load_after[0]:.1f} after)", rows)


if __name__ == "__main__":
    main()
