"""``yak eval``: measure recall quality on benchmark conversations (``yak eval locomo``)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from yak_pipeline.cli.errors import USAGE_EXIT, fail, friendly_errors
from yak_pipeline.cli.parts import cli_parts

if TYPE_CHECKING:  # imported by the commands: every `yak` command imports this module
    from rich.console import Console

    from yak_pipeline.eval.options import Progress
    from yak_pipeline.settings import Settings

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


DISTILLER_HELP = ("What distils the exchanges: rules (the offline rules provider), none (nothing: raw words only; "
                  "vectors still made), local (the packaged local model, `make setup-llm`). Default: the "
                  "YAK_LLM_BASE_URL endpoint when set, else rules.")


def _load(data: list[Path], limit_conversations: int | None) -> list[tuple[str, list]]:
    """Each ``--data`` file's conversations, labelled by the path as given; one-line usage errors."""
    from yak_pipeline.eval.locomo import LocomoFormatError, load_locomo

    if len({str(p) for p in data}) != len(data):
        raise fail("the same --data file is given twice", USAGE_EXIT)
    try:
        return [(str(path), load_locomo(path, limit_conversations=limit_conversations)) for path in data]
    except LocomoFormatError as exc:
        raise fail(str(exc), USAGE_EXIT) from None


def _distiller_settings(settings: Settings, stack: ExitStack, distiller: str | None, local_llm: bool,
                        console: Console):
    """The settings to run with and the distiller name (``local`` starts the packaged model in ``stack``)."""
    if local_llm:
        if distiller not in (None, "local"):
            raise fail("--local-llm is --distiller local; give one of them", USAGE_EXIT)
        distiller = "local"
    if distiller is not None and distiller not in ("rules", "none", "local"):
        raise fail(f"--distiller {distiller!r}: use rules, none or local", USAGE_EXIT)
    if distiller == "local":
        from yak_pipeline.cli.local_llm import local_llm_running

        settings, _ = stack.enter_context(local_llm_running(settings, console))
    return settings, distiller


@contextmanager
def _eval_run(settings: Settings, distiller: str | None, local_llm: bool,
              interrupted: str) -> Iterator[tuple[Settings, str | None, Progress]]:
    """One `yak eval` run on ``settings``: the settings to run with, the chosen distiller (``local`` starts the packaged model
    for the run) and a progress sink printing on stderr. Ctrl-C in the run ends the command with
    exit code 130 and ``interrupted`` on stderr instead of a traceback."""
    from rich.console import Console

    console = Console(stderr=True)
    with ExitStack() as stack:
        settings, chosen = _distiller_settings(settings, stack, distiller, local_llm, console)
        try:
            yield settings, chosen, lambda line: console.print(line, highlight=False, markup=False)
        except KeyboardInterrupt:
            print(interrupted, file=sys.stderr)
            raise typer.Exit(130) from None


@app.command("locomo")
@friendly_errors
def locomo_command(
    ctx: typer.Context,
    data: list[Path] = typer.Option(..., "--data", help="A LoCoMo-format JSON file, e.g. data/locomo10.json of github.com/snap-research/locomo (no data ships with Yak); repeat --data for more files (each reported on its own, cross-validated together)."),
    k: str = typer.Option("1,5,10", "--k", help="Cut-offs for Recall@k, Hit@k and nDCG@k, comma-separated."),
    limit_conversations: int | None = typer.Option(None, "--limit-conversations", help="Only the first N conversations of each file."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON on stdout (progress stays on stderr)."),
    out: Path = typer.Option(DEFAULT_OUT, "--out", help="Folder for retrieval_eval.json and retrieval_eval.png."),
    threshold: float = typer.Option(0.7, "--threshold", help="Recall threshold t of DESIGN §4 (the API's default)."),
    ablations: bool = typer.Option(False, "--ablations", help="Also run Yak variants: decay off, half-lives, one leg kind only, no gate."),
    keep_db: bool = typer.Option(False, "--keep-db", help="Keep the evaluation databases instead of dropping them."),
    target_points: float = typer.Option(5.0, "--target-points", help="Required Recall@k margin of the default recall over the better baseline."),
    distiller: str | None = typer.Option(None, "--distiller", help=DISTILLER_HELP),
    folds: int = typer.Option(5, "--folds", help="Conversation-level cross-validation folds for the \"Yak\" figure (over all files' conversations)."),
    local_llm: bool = typer.Option(False, "--local-llm", hidden=True, help="Deprecated: --distiller local."),
    llm_judge: bool = typer.Option(False, "--llm-judge", help="Also score \"Yak + LLM judge\": the default recall, then the LLM (YAK_LLM_BASE_URL or --distiller local) drops what it judges irrelevant (YAK_RECALL_LLM_JUDGE)."),
) -> None:
    """Ingest LoCoMo-format files into fresh databases through the real pipeline, then score
    BM25, dense and Yak's default recall (cross-validated, in-sample and with the shipped model)
    against each question's evidence turns, per file, and measure knowledge updates (current
    first) and abstention on never-said questions."""
    from rich.console import Console

    from yak_pipeline.eval.options import EvalOptions
    from yak_pipeline.eval.report import print_report, write_chart, write_json
    from yak_pipeline.eval.runner import run_locomo_eval

    try:
        ks = parse_ks(k)
    except ValueError as exc:
        raise fail(str(exc), USAGE_EXIT) from None
    if limit_conversations is not None and limit_conversations < 1:
        raise fail("--limit-conversations must be at least 1", USAGE_EXIT)
    if not 0.0 <= threshold <= 1.0:
        raise fail("--threshold must be between 0 and 1", USAGE_EXIT)
    if folds < 2:
        raise fail("--folds must be at least 2", USAGE_EXIT)
    datasets = _load(data, limit_conversations)
    with _eval_run(cli_parts(ctx).settings, distiller, local_llm, "interrupted: the evaluation databases were dropped") as (
            settings, chosen, progress):
        if llm_judge and not settings.llm_base_url:
            raise fail("--llm-judge needs an LLM: set YAK_LLM_BASE_URL or add --distiller local", USAGE_EXIT)
        options = EvalOptions(ks=ks, threshold=threshold, ablations=ablations, keep_database=keep_db,
                              required_points=target_points, llm_judge=llm_judge, distiller=chosen, folds=folds)
        report = run_locomo_eval(settings, datasets, options, progress=progress)
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
    ctx: typer.Context,
    data: list[Path] = typer.Option(..., "--data", help="LoCoMo-format JSON files to fit on (repeat --data for each)."),
    out: Path | None = typer.Option(None, "--out", help="Where to write the model JSON; default $YAK_HOME/recall_models/<embedder>.json."),
    as_json: bool = typer.Option(False, "--json", help="Print the fitted model as JSON on stdout."),
    distiller: str | None = typer.Option(None, "--distiller", help=DISTILLER_HELP),
    folds: int = typer.Option(5, "--folds", help="Conversation-level cross-validation folds for the out-of-sample figures."),
    report_out: Path | None = typer.Option(None, "--report-out", help="Also write the evaluation report (retrieval_eval.json) into this folder."),
) -> None:
    """Fit the calibrated-relevance model for the configured embedder on labelled conversations
    (docs/RECALL.md): every file goes through the real pipeline (the collection pass of
    `yak eval locomo`), every question's candidates become labelled examples, and a logistic
    model is fitted on all of them with each file weighted equally. The cross-validated figures
    (each conversation ranked by a model fitted without it) are printed too."""
    from rich.console import Console

    from yak_pipeline.eval.calibrate import calibrate
    from yak_pipeline.eval.report import print_cross_validated, write_json
    from yak_pipeline.recall_models import model_file_name, user_models_dir

    if folds < 2:
        raise fail("--folds must be at least 2", USAGE_EXIT)
    datasets = _load(data, None)
    with _eval_run(cli_parts(ctx).settings, distiller, False, "interrupted: nothing was written") as (settings, chosen, progress):
        model, report = calibrate(settings, datasets, folds=folds, distiller=chosen, progress=progress)
    target = out or user_models_dir(Path(settings.home)) / model_file_name(model.embedding_model)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(model.to_dict(), indent=2) + "\n")
    if report_out is not None:
        write_json(report, report_out)
    if as_json:
        print(json.dumps(model.to_dict()))
    else:
        Console().print(f"relevance model {model.version}: bias {model.bias:.3f}, weights "
                        + ", ".join(f"{k} {v:.3f}" for k, v in model.weights.items()), highlight=False)
        files = model.fitted_on.get("files")
        for name, info in (files.items() if isinstance(files, Mapping) else ()):
            Console().print(f"  {name}: {info['examples']} examples, {info['relevant']} relevant, "
                            f"ROC AUC {info['roc_auc']}", highlight=False)
        print_cross_validated(report)
        Console().print(f"wrote {target}", highlight=False)
