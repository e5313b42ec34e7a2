"""Output of the LoCoMo evaluation: per data file the tables (methods × metrics), the JSON file and a PNG chart.

The report (``runner.run_evaluation``) holds one section per file under ``"files"``; "Yak" is the
cross-validated figure (``"evaluation"`` names the method), beside "Yak (in-sample)" and "Yak
(shipped model)"."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

JSON_NAME = "retrieval_eval.json"
PNG_NAME = "retrieval_eval.png"


def _columns(ks: Sequence[int]) -> list[tuple[str, str]]:
    """(metric key, header) pairs of the main table."""
    cols = [(f"recall@{k}", f"R@{k}") for k in ks] + [(f"hit@{k}", f"Hit@{k}") for k in ks]
    return cols + [("mrr", "MRR"), (f"ndcg@{max(ks)}", f"nDCG@{max(ks)}")]


def _table(title: str, rows: dict[str, dict], ks: Sequence[int], group: str = "overall") -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("method")
    table.add_column("n", justify="right")
    cols = _columns(ks)
    for _, header in cols:
        table.add_column(header, justify="right")
    table.add_column("p50 ms", justify="right")
    for name, report in rows.items():
        summary = report["overall"] if group == "overall" else report["by_category"].get(group)
        if summary is None:
            continue
        table.add_row(name, str(int(summary["n"])), *(f"{summary[key]:.3f}" for key, _ in cols),
                      f"{report['latency_ms']['p50']:.1f}")
    return table


def _category_table(report: dict[str, Any], rows: dict[str, dict], title: str) -> Table:
    """One row per method and category: the question count and the main metrics."""
    ks = report["ks"]
    depth = max(ks)
    metrics = [(f"recall@{k}", f"R@{k}") for k in ks] + [("mrr", "MRR"), (f"ndcg@{depth}", f"nDCG@{depth}")]
    table = Table(title=title, title_justify="left")
    table.add_column("method")
    table.add_column("category")
    table.add_column("n", justify="right")
    for _, header in metrics:
        table.add_column(header, justify="right")
    for name, data in rows.items():
        for category, label in report["categories"].items():
            summary = data["by_category"].get(category)
            if summary is None:
                continue
            table.add_row(name, f"{category} {label}", str(int(summary["n"])),
                          *(f"{summary[key]:.3f}" for key, _ in metrics))
        table.add_section()
    return table


def _measures_table(report: dict[str, Any], title: str = "Knowledge updates and abstention") -> Table:
    """Knowledge updates and abstention per method (— where the file has no such questions)."""
    table = Table(title=title, title_justify="left")
    for column in ("method", "knowledge_update_current_first", "n", "abstention_empty", "n"):
        table.add_column(column, justify="left" if column == "method" else "right")
    rows = {**report["methods"], **report.get("ablations", {})}

    def shown(data: dict[str, Any], key: str) -> str:
        return "—" if data.get(key) is None else f"{data[key]:.3f}"

    for name, data in rows.items():
        table.add_row(name, shown(data, "knowledge_update_current_first"), str(data.get("knowledge_update_n", 0)),
                      shown(data, "abstention_empty"), str(data.get("abstention_n", 0)))
    return table


_BLOCK_COLUMNS = (("block_precision", "precision"), ("block_recall", "recall"), ("block_size", "size"),
                  ("tokens", "tokens"), ("tokens_with_profile", "+profile"), ("stale_lead", "stale lead"),
                  ("empty", "empty"))
_TOKEN_COLUMNS = frozenset({"tokens", "tokens_with_profile"})


def _block_table(report: dict[str, Any], title: str) -> Table:
    """The injected block per Yak method (its cut, then the first memories uncut), and per category
    for the cross-validated one (— where a measure does not apply)."""
    table = Table(title=title, title_justify="left")
    for column in ("method", "block", "category", "n", *(header for _, header in _BLOCK_COLUMNS), "stale n"):
        table.add_column(column, justify="left" if column in ("method", "block", "category") else "right")

    def row(name: str, which: str, category: str, data: dict[str, Any]) -> None:
        cells = ["—" if data.get(key) is None else f"{data[key]:.0f}" if key in _TOKEN_COLUMNS else f"{data[key]:.3f}"
                 for key, _ in _BLOCK_COLUMNS]
        table.add_row(name, which, category, str(data["n"]), *cells, str(data["stale_lead_n"]))

    for name, data in report["methods"].items():
        for which, label in (("block", "chosen"), ("fixed_block", "first, uncut")):
            if which in data:
                row(name, label, "all", data[which])
        table.add_section()
    chosen = report["methods"].get(report.get("default_method", ""), {}).get("block")
    if chosen:
        for category, label in report["categories"].items():
            if category in chosen["by_category"]:
                row(report["default_method"], "chosen", f"{category} {label}", chosen["by_category"][category])
    return table


def _ability_table(report: dict[str, Any], title: str) -> Table | None:
    """Per ability (where the file names them, as BEAM does): each method's Recall@k at the largest
    k, and the cross-validated Yak's block recall and precision, and (instruction and preference
    questions) its profile hit; None when the file names none."""
    methods = report["methods"]
    abilities = sorted({a for data in methods.values() for a in data.get("by_ability", {})})
    if not abilities:
        return None
    key = f"recall@{max(report['ks'])}"
    table = Table(title=title, title_justify="left")
    table.add_column("ability")
    table.add_column("n", justify="right")
    for name in methods:
        table.add_column(f"{name} R@{max(report['ks'])}", justify="right")
    default = methods.get(report.get("default_method", ""), {}).get("block", {}).get("by_ability", {})
    table.add_column("block recall", justify="right")
    table.add_column("block precision", justify="right")
    table.add_column("profile hit", justify="right")
    for ability in abilities:
        cells = [data.get("by_ability", {}).get(ability) for data in methods.values()]
        n = next((int(c["n"]) for c in cells if c), 0)
        block = default.get(ability, {})
        table.add_row(ability, str(n), *("—" if c is None else f"{c[key]:.3f}" for c in cells),
                      *("—" if block.get(m) is None else f"{block[m]:.3f}"
                        for m in ("block_recall", "block_precision", "profile_hit")))
    return table


def print_report(report: dict[str, Any], console: Console | None = None) -> None:
    """Per file: the overall table, the per-category table, the measures and the target verdict."""
    # Tables this wide wrap into unreadable columns at a pipe's default 80 characters.
    console = console or Console(width=max(Console().width, 150))
    ks = report["ks"]
    settings = report["settings"]
    console.print(f"LoCoMo retrieval evaluation: {len(report['files'])} file(s), {report['conversations']} conversations, "
                  f"{report['turns']} turns, {report['questions']['scored']} questions (categories 1-4); embedder "
                  f"{settings['embedder']}, distiller {report['distiller']} ({settings['llm_provider']}), threshold "
                  f"{settings['threshold']}, half-life {settings['half_life_days']:g} d, decay "
                  f"{'on' if settings['decay_enabled'] else 'off'}, relevance exponent {settings['relevance_exponent']:g}",
                  highlight=False)
    console.print(f"\"Yak\": {report['evaluation']}; shipped model {settings['relevance_models']['shipped']}, "
                  f"in-sample model {settings['relevance_models']['in_sample']}", highlight=False)
    for note in report.get("notes", []):
        console.print(f"note: {note}", highlight=False)
    categories = report["categories"]
    for label, section in report["files"].items():
        name = Path(label).name
        section = {**section, "ks": ks, "categories": categories}
        console.print(f"\n[bold]{name}[/bold]: {section['conversations']} conversations, {section['turns']} turns → "
                      f"{section['exchanges']} exchanges ({section['paired_conversations']} conversations with an "
                      f"assistant, a user turn and its reply one exchange), {section['questions']['scored']} "
                      f"questions, {section['questions']['never_said']} never-said")
        console.print(_table(f"{name}: overall (methods × metrics)", section["methods"], ks))
        console.print(_category_table(section, section["methods"], f"{name}: per category"))
        abilities = _ability_table({**section, "default_method": report["default_method"]}, f"{name}: per ability")
        if abilities is not None:
            console.print(abilities)
        if section.get("ablations"):
            console.print(_table(f"{name}: ablations (same data, one change each)", section["ablations"], ks))
            console.print(_category_table(section, section["ablations"], f"{name}: ablations per category"))
        console.print(f"Evidence turns held by an active distillation (raw exchanges hold the rest): "
                      f"{section['distilled_evidence']:.3f}; distillations by status: "
                      f"{section['pipeline']['counts'].get('distillations_by_status', {})}")
        llm_line = _llm_line(section["pipeline"].get("llm", {}).get("distil"), section["pipeline"]["counts"])
        if llm_line:
            console.print(llm_line, highlight=False)
        console.print(_measures_table(section, f"{name}: knowledge updates and abstention"))
        block = settings.get("block")
        if block:
            console.print(_block_table({**section, "default_method": report["default_method"]},
                                       f"{name}: the injected block (first {block['limit']} recalled, odds gap "
                                       f"{block['odds_gap']}, {block['token_budget']} tokens; superseded left out; "
                                       f"+profile: with the profile part, {block.get('profile_tokens', 0)} tokens at most)"))
        console.print(_target_line(section["target"], name))
    verdict = "met" if report["target"]["met"] else "NOT met"
    console.print(f"Target {verdict} on {'every file' if report['target']['met'] else 'not every file'} "
                  f"(cross-validated Yak).")


def _target_line(target: dict[str, Any], name: str) -> str:
    verdict = "met" if target["met"] else "NOT met"
    return (f"{name}: target {verdict}: {target['default_method']} (the default recall, cross-validated) "
            f"{target['metric']} {target['default']:.3f} vs best baseline {target['best_baseline']} "
            f"{target['baseline']:.3f}: {target['margin_points']:+.1f} points (need +{target['required_points']:g})")


def print_cross_validated(report: dict[str, Any], console: Console | None = None) -> None:
    """The out-of-sample figures of a calibration: per file, BM25, dense and the three Yak, overall."""
    console = console or Console(width=max(Console().width, 150))
    console.print(f"\"Yak\": {report['evaluation']}", highlight=False)
    for label, section in report["files"].items():
        console.print(_table(f"{Path(label).name}: overall", section["methods"], report["ks"]))
        console.print(_measures_table(section, f"{Path(label).name}: knowledge updates and abstention"))


def _llm_line(distil: dict[str, Any] | None, counts: dict[str, Any]) -> str | None:
    """One line on the distiller: who answered, valid-output rate, latency per exchange, tokens."""
    if not distil or not distil.get("calls") and not distil.get("failed_calls"):
        return None
    rate = distil["valid_output_rate"]
    latency = distil["latency_ms"] or {}
    models = ", ".join(distil["models"]) or "unnamed"
    tokens = (f"; tokens {distil['prompt_tokens']} in, {distil['completion_tokens']} out"
              if distil["prompt_tokens"] is not None else "")
    return (f"Distiller {models}: {counts.get('distilled', 0)} exchanges distilled, {counts.get('distill_failed', 0)} "
            f"kept pending; {distil['requests']} requests, {distil['invalid_outputs']} invalid answers "
            f"(valid-output rate {rate if rate is None else f'{rate:.3f}'}); latency per exchange "
            f"p50 {latency.get('p50', 0):.0f} ms, p95 {latency.get('p95', 0):.0f} ms{tokens}")


def write_json(report: dict[str, Any], out_dir: Path) -> Path:
    """Write the report as JSON into ``out_dir``; returns the file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / JSON_NAME
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def write_chart(report: dict[str, Any], out_dir: Path) -> Path:
    """Grouped bars of Recall@k (largest k) and MRR per category and method, one row per file, as PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed; also safe in worker threads
    import matplotlib.pyplot as plt
    import numpy as np

    out_dir.mkdir(parents=True, exist_ok=True)
    depth = max(report["ks"])
    files = report["files"]
    fig, axes = plt.subplots(len(files), 2, figsize=(13, 4.8 * len(files)), sharey=True, squeeze=False)
    for row, (label, section) in enumerate(files.items()):
        methods = section["methods"]
        groups = ["overall"] + list(report["categories"])
        labels = ["overall"] + [f"{c} {report['categories'][c]}" for c in report["categories"]]
        width = 0.8 / max(len(methods), 1)
        x = np.arange(len(groups))
        for axis, metric, title in ((axes[row][0], f"recall@{depth}", f"Recall@{depth}"), (axes[row][1], "mrr", "MRR")):
            for i, (name, data) in enumerate(methods.items()):
                values = [(data["overall"] if g == "overall" else data["by_category"].get(g, {})).get(metric, 0.0)
                          for g in groups]
                bars = axis.bar(x + (i - (len(methods) - 1) / 2) * width, values, width, label=name)
                axis.bar_label(bars, fmt="%.2f", fontsize=5, padding=1)
            axis.set_xticks(x, labels, fontsize=8)
            axis.set_title(f"{Path(label).name}: {title} ({section['questions']['scored']} questions)", fontsize=9)
            axis.set_ylim(0, 1)
            axis.grid(axis="y", alpha=0.3)
        axes[row][0].legend(fontsize=7, loc="upper right")
    fig.suptitle(f"LoCoMo-format retrieval: embedder {report['settings']['embedder']}, distiller "
                 f"{report['distiller']}; Yak cross-validated ({report['cross_validation']['folds']} folds)", fontsize=10)
    fig.tight_layout()
    path = out_dir / PNG_NAME
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
