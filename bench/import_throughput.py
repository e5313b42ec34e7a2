"""History import throughput: ``python bench/import_throughput.py [--n 5000] [--json]``.

Writes a ChatGPT data export of N exchanges (``conversations.json`` in the export's zip, in a
scratch folder): conversations of 10 exchanges, each a ``mapping`` tree with what real exports
carry besides the exchanges (a hidden system message, an edited prompt's abandoned branch, a
tool call and its output per conversation). Then, on a scratch database:

1. **parse** — :func:`parse_history_file` on the zip, in-process (unzip, JSON, branch walking);
2. **yak import** — ``yak import export.zip --user bench --json`` in a subprocess, wall time
   with start-up, and again (re-import: every exchange found already there).

Reports exchanges/s for each (the issue sets no target). Most of ``yak import``'s time is the
database's: each stored exchange refreshes its own and its neighbours' conversation context
(the trigger of sql/006; an export's exchanges are minutes apart, so every one has neighbours).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import ROOT, print_table, progress, scratch_database, write_result  # noqa: E402

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


def bench_import(url: str, export: Path, home: str) -> dict:
    """``yak import`` twice in a subprocess: the first stores everything, the second finds it all."""
    # The configured embedder (the scratch database was migrated for it); its own home and drop folder.
    env = {**os.environ, "YAK_HOME": home, "YAK_DATABASE_URL": url, "YAK_DROP_DIR": str(Path(home) / "drop")}
    runs = []
    for _ in range(2):
        began = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "yak_pipeline.cli.main", "import", str(export), "--user", "bench",
                               "--json"], env=env, capture_output=True, text=True, cwd=ROOT)
        seconds = time.monotonic() - began
        if done.returncode != 0:
            raise RuntimeError(f"yak import failed ({done.returncode}): {done.stderr.strip()[-400:]}")
        totals = json.loads(done.stdout)["totals"]
        runs.append({"seconds": round(seconds, 2), "stored": totals["exchanges"],
                     "already_stored": totals["already_stored"]})
    return {"first": runs[0], "again": runs[1]}


def main() -> None:
    """Run the benchmark and print (or ``--json``) the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5000, help="Exchanges in the export.")
    parser.add_argument("--json", action="store_true", help="Print the result as JSON.")
    args = parser.parse_args()
    from yak_pipeline.core.history_files import parse_history_file

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
        with scratch_database(settings) as url:
            imported = bench_import(url, export, str(Path(folder) / "home"))
    first, again = imported["first"], imported["again"]
    result = {
        "exchanges": exchanges, "export_bytes": size,
        "parse_seconds": round(parse_seconds, 2), "parse_exchanges_per_s": round(exchanges / parse_seconds, 1),
        "import": first, "import_exchanges_per_s": round(first["stored"] / first["seconds"], 1),
        "reimport": again, "reimport_exchanges_per_s": round(exchanges / again["seconds"], 1),
    }
    path = write_result(f"import_throughput_n{args.n}", result)
    if args.json:
        print(json.dumps(result))
        return
    rate = result["import_exchanges_per_s"]
    print_table(f"History import: a {exchanges}-exchange ChatGPT export ({path.relative_to(ROOT)})", [
        ("parse (in-process)", f"{result['parse_exchanges_per_s']:.0f} exchanges/s", "", ""),
        ("yak import (wall, start-up included)", f"{rate:.0f} exchanges/s ({first['seconds']:.1f}s)", "", ""),
        ("yak import again (adds nothing)", f"{result['reimport_exchanges_per_s']:.0f} exchanges/s "
         f"({again['stored']} new)", "", ""),
    ])


if __name__ == "__main__":
    main()
