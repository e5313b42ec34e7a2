"""``yak eval``: measure recall quality on benchmark conversations (``yak eval locomo``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console

from yak_pipeline.cli.errors import USAGE_EXIT, fail, friendly_errors
from yak_pipeline.settings import get_settings

app = typer.Typer(help="Evaluate recall quality on benchmark data.", no_args_is_help=True)

DEFAULT_OUT = Path("bench/results")


def parse_ks(value: str) -> tuple[int, ...]:
    """``"1,5,10"`` as (1, 5, 10); raises ValueError with a one-line reason otherwise."""
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not parts:
        raise ValueError("--k needs at least one cut-off, e.g. 1,5,10")
    try:
        ks = tuple(sorted({int(p) for p in parts}))
    except ValueError:
        raise ValueError(f"--k {value!r} must be comma-separated whole numbers, e.g. 1,5,10") from None
    if ks[0] < 1 or ks[-1] > 100:
        raise ValueError(f"--k {value!r}: each cut-off must be between 1 and 100")
    return ks


@app.command("locomo")
@friendly_errors
def locomo_command(
    data: Path = typer.Option(..., "--data", help="A LoCoMo-format JSON file, e.g. ../shared/data/locomo/locomo_dev.json."),
    k: str = typer.Option("1,5,10", "--k", help="Cut-offs for Recall@k, Hit@k and nDCG@k, comma-separated."),
    limit_conversations: int | None = typer.Option(None, "--limit-conversations", help="Only the first N conversations."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout (progress stays on stderr)."),
    out: Path = typer.Option(DEFAULT_OUT, "--out", help="Folder for retrieval_eval.json and retrieval_eval.png."),
    threshold: float = typer.Option(0.7, "--threshold", help="Recall threshold t of DESIGN §4 (the API's default)."),
    ablations: bool = typer.Option(False, "--ablations", help="Also run Yak variants: decay off, half-lives, one leg kind only, no gate."),
    keep_db: bool = typer.Option(False, "--keep-db", help="Keep the evaluation database instead of dropping it."),
) -> None:
    """Ingest a LoCoMo-format file into a fresh database through the real pipeline, then score
    BM25, dense, Yak and Yak hybrid recall against each question's evidence turns."""
    from yak_pipeline.eval.locomo import LocomoFormatError, load_locomo
    from yak_pipeline.eval.report import print_report, write_chart, write_json
    from yak_pipeline.eval.runner import EvalOptions, run_locomo_eval

    try:
        ks = parse_ks(k)
    except ValueError as exc:
        raise fail(str(exc), USAGE_EXIT) from None
    if limit_conversations is not None and limit_conversations < 1:
        raise fail("--limit-conversations must be at least 1", USAGE_EXIT)
    if not 0.0 <= threshold <= 1.0:
        raise fail("--threshold must be between 0 and 1", USAGE_EXIT)
    try:
        conversations = load_locomo(data, limit_conversations=limit_conversations)
    except LocomoFormatError as exc:
        raise fail(str(exc), USAGE_EXIT) from None
    progress_console = Console(stderr=True)
    settings = get_settings()
    options = EvalOptions(ks=ks, threshold=threshold, ablations=ablations, keep_database=keep_db)
    try:
        report = run_locomo_eval(settings, conversations, options, data_label=str(data),
                                 progress=lambda line: progress_console.print(line, highlight=False, markup=False))
    except KeyboardInterrupt:
        print("interrupted: the evaluation database was dropped", file=sys.stderr)
        raise typer.Exit(130) from None
    json_path = write_json(report, out)
    png_path = write_chart(report, out)
    if as_json:
        print(json.dumps(report))
    else:
        print_report(report)
        Console().print(f"wrote {json_path} and {png_path}")
