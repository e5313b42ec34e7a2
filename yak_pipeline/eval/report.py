"""Output of the LoCoMo evaluation: the table (methods × metrics), the JSON file and a PNG chart."""

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


def _measures_table(report: dict[str, Any]) -> Table:
    """Knowledge updates and abstention per method (— where the file has no such questions)."""
    table = Table(title="Knowledge updates and abstention", title_justify="left")
    for column in ("method", "knowledge_update_current_first", "n", "abstention_empty", "n"):
        table.add_column(column, justify="left" if column == "method" else "right")
    rows = {**report["methods"], **report.get("ablations", {})}
    for name, data in rows.items():
        def shown(key: str) -> str:
            return "—" if data.get(key) is None else f"{data[key]:.3f}"
        table.add_row(name, shown("knowledge_update_current_first"), str(data.get("knowledge_update_n", 0)),
                      shown("abstention_empty"), str(data.get("abstention_n", 0)))
    return table


def print_report(report: dict[str, Any], console: Console | None = None) -> None:
    """The overall table, the per-category table and the target verdict, for people."""
    # Tables this wide wrap into unreadable columns at a pipe's default 80 characters.
    console = console or Console(width=max(Console().width, 150))
    ks = report["ks"]
    settings = report["settings"]
    console.print(f"LoCoMo retrieval evaluation: {report['conversations']} conversations, {report['turns']} turns, "
                  f"{report['questions']['scored']} questions (categories 1-4); embedder {settings['embedder']}, "
                  f"LLM {settings['llm_provider']}, threshold {settings['threshold']}, "
                  f"half-life {settings['half_life_days']:g} d, decay {'on' if settings['decay_enabled'] else 'off'}, "
                  f"relevance model {settings['relevance_model']}, relevance exponent {settings['relevance_exponent']:g}")
    console.print(_table("Overall (methods × metrics)", report["methods"], ks))
    console.print(_category_table(report, report["methods"], "Per category"))
    if report.get("ablations"):
        console.print(_table("Ablations (same data, one change each)", report["ablations"], ks))
        console.print(_category_table(report, report["ablations"], "Ablations per category"))
    console.print(f"Evidence turns held by an active distillation (the ceiling of Yak's Recall@k): "
                  f"{report['recallable_evidence']:.3f}; distillations by status: "
                  f"{report['pipeline']['counts'].get('distillations_by_status', {})}")
    llm_line = _llm_line(report["pipeline"].get("llm", {}).get("distil"), report["pipeline"]["counts"])
    if llm_line:
        console.print(llm_line, highlight=False)
    console.print(_measures_table(report))
    target = report["target"]
    verdict = "met" if target["met"] else "NOT met"
    console.print(f"Target {verdict}: {target['default_method']} (the default recall) {target['metric']} "
                  f"{target['default']:.3f} vs best baseline {target['best_baseline']} {target['baseline']:.3f}: "
                  f"{target['margin_points']:+.1f} points (need +{target['required_points']:g})")


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
    """A grouped bar chart of Recall@k (largest k) and MRR per category and method, as PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed; also safe in worker threads
    import matplotlib.pyplot as plt
    import numpy as np

    out_dir.mkdir(parents=True, exist_ok=True)
    depth = max(report["ks"])
    methods = report["methods"]
    groups = ["overall"] + list(report["categories"])
    labels = ["overall"] + [f"{c} {report['categories'][c]}" for c in report["categories"]]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    width = 0.8 / max(len(methods), 1)
    x = np.arange(len(groups))
    for axis, metric, title in ((axes[0], f"recall@{depth}", f"Recall@{depth}"), (axes[1], "mrr", "MRR")):
        for i, (name, data) in enumerate(methods.items()):
            values = [(data["overall"] if g == "overall" else data["by_category"].get(g, {})).get(metric, 0.0)
                      for g in groups]
            bars = axis.bar(x + (i - (len(methods) - 1) / 2) * width, values, width, label=name)
            axis.bar_label(bars, fmt="%.2f", fontsize=6, padding=1)
        axis.set_xticks(x, labels, fontsize=8)
        axis.set_title(title)
        axis.set_ylim(0, 1)
        axis.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8, loc="upper right")
    fig.suptitle(f"LoCoMo retrieval: {report['questions']['scored']} questions, embedder "
                 f"{report['settings']['embedder']}, LLM {report['settings']['llm_provider']}", fontsize=10)
    fig.tight_layout()
    path = out_dir / PNG_NAME
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
