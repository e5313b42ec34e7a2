"""``yak eval``: measure recall quality on benchmark conversations (``yak eval locomo``)."""

from __future__ import annotations

import json
import sys
from contextlib import ExitStack
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
    target_points: float = typer.Option(5.0, "--target-points", help="Required Recall@k margin of the default recall over the better baseline."),
    local_llm: bool = typer.Option(False, "--local-llm", help="Distil with the packaged local model (as `yak up --local-llm`; `make setup-llm`) instead of YAK_LLM_BASE_URL or the rules provider."),
    llm_judge: bool = typer.Option(False, "--llm-judge", help="Also score \"Yak + LLM judge\": the default recall, then the LLM (YAK_LLM_BASE_URL or --local-llm) drops what it judges irrelevant (YAK_RECALL_LLM_JUDGE)."),
) -> None:
    """Ingest a LoCoMo-format file into a fresh database through the real pipeline, then score
    BM25, dense and Yak's default recall against each question's evidence turns, and measure
    knowledge updates (current first) and abstention on never-said questions."""
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
    options = EvalOptions(ks=ks, threshold=threshold, ablations=ablations, keep_database=keep_db,
                          required_points=target_points, llm_judge=llm_judge)
    with ExitStack() as stack:
        settings = get_settings()
        if local_llm:
            from yak_pipeline.cli.local_llm import local_llm_running

            settings, _ = stack.enter_context(local_llm_running(settings, progress_console))
        if llm_judge and not settings.llm_base_url:
            raise fail("--llm-judge needs an LLM: set YAK_LLM_BASE_URL or add --local-llm", USAGE_EXIT)
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


@app.command("calibrate")
@friendly_errors
def calibrate_command(
    data: list[Path] = typer.Option(..., "--data", help="LoCoMo-format JSON files to fit on (repeat --data for each)."),
    out: Path | None = typer.Option(None, "--out", help="Where to write the model JSON; default $YAK_HOME/recall_models/<embedder>.json."),
    as_json: bool = typer.Option(False, "--json", help="Print the fitted model as JSON on stdout."),
) -> None:
    """Fit the calibrated-relevance model for the configured embedder on labelled conversations
    (docs/RECALL.md): every file goes through the real pipeline, every question's candidates
    become labelled examples, and a logistic model is fitted with each file weighted equally."""
    from yak_pipeline.eval.calibrate import calibrate
    from yak_pipeline.eval.locomo import LocomoFormatError, load_locomo
    from yak_pipeline.recall_models import model_file_name, user_models_dir

    try:
        datasets = [(str(path), load_locomo(path)) for path in data]
    except LocomoFormatError as exc:
        raise fail(str(exc), USAGE_EXIT) from None
    settings = get_settings()
    progress_console = Console(stderr=True)
    try:
        model = calibrate(settings, datasets,
                          progress=lambda line: progress_console.print(line, highlight=False, markup=False))
    except KeyboardInterrupt:
        print("interrupted: nothing was written", file=sys.stderr)
        raise typer.Exit(130) from None
    target = out or user_models_dir(Path(settings.home)) / model_file_name(model.embedding_model)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(model.to_dict(), indent=2) + "\n")
    if as_json:
        print(json.dumps(model.to_dict()))
    else:
        Console().print(f"relevance model {model.version}: bias {model.bias:.3f}, weights "
                        + ", ".join(f"{k} {v:.3f}" for k, v in model.weights.items()), highlight=False)
        for name, info in model.fitted_on["files"].items():  # type: ignore[union-attr]
            Console().print(f"  {name}: {info['examples']} examples, {info['relevant']} relevant, "
                            f"ROC AUC {info['roc_auc']}", highlight=False)
        Console().print(f"wrote {target}", highlight=False)
