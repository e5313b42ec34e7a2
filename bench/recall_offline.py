"""Recall experiments offline: collect every dev question's candidates once, then try rankings and
block cuts on them in seconds, cross-validated over conversations.

``python bench/recall_offline.py collect --distiller rules --out /tmp/rules.pkl``
    runs ``yak eval``'s collection pass (``eval.collection.collect``: each file through the real
    pipeline into a scratch database, every question asked once of ``store.recall.recall_candidates``)
    and pickles each question's candidates with the turns each holds and the baselines' rankings
    (the three dev files by default; 12-19 minutes on 2 cores).

``python bench/recall_offline.py curves /tmp/rules.pkl [--exponent 30]``
    prints, per file, Yak's Recall@10 with the relevance model fitted the way ``yak eval
    calibrate`` fits it (``eval.calibrate.fit_logistic`` and the operating points), each
    conversation ranked by the model of the fold that did not see it (``eval.cross_validation.assign_folds``,
    5 folds), against the better baseline; then the block's precision / recall / size for a
    range of odds gaps (``core.block_choice``; superseded memories left out, as the block does).

The ranking here is ``core.recall.rank_memories``' order (score = e × logit(standing) + ln decay +
ln(1 + warmth) + ln gravity + ln f_superseded, after the gate) on the top 10; the reorderings that
do not change which ten are recalled (a present question's newest first) are left out. It is for
choosing what to build: the figures to quote come from ``yak eval locomo`` (docs/RECALL.md).
"""

from __future__ import annotations

import argparse
import math
import pickle
import sys
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from yak_pipeline.core.query_intent import asks_about_past  # noqa: E402
from yak_pipeline.core.relevance import (  # noqa: E402
    ANSWERABLE_FEATURES,
    FEATURES,
    NON_NEGATIVE_FEATURES,
    answerable_features,
    relevance_features,
)
from yak_pipeline.core.scoring import decay_factor, gravity, passes_tier_gate  # noqa: E402
from yak_pipeline.eval.calibrate import ANSWERABLE_PASS_SHARE, TRUE_PASS_SHARE, fit_logistic, operating_point_shift  # noqa: E402
from yak_pipeline.eval.cross_validation import assign_folds  # noqa: E402

DEV_FILES = (ROOT.parent / "shared/data/paraphrase/paraphrase_dev.json", ROOT.parent / "shared/data/locomo/locomo_dev.json",
             Path("/tmp/beam/beam_dev.json"))
THRESHOLD, HALF_LIFE_DAYS, SUPERSEDED_FACTOR = 0.7, 30.0, 0.5


def collect_command(args: argparse.Namespace) -> None:
    """The collection pass of ``yak eval``, pickled."""
    from yak_pipeline.eval.collection import collect
    from yak_pipeline.eval.locomo import load_locomo
    from yak_pipeline.eval.options import EvalOptions
    from yak_pipeline.settings import get_settings

    datasets = [(Path(f).name, load_locomo(Path(f))) for f in args.data]
    with ExitStack() as stack:
        files = collect(get_settings(), datasets, EvalOptions(distiller=args.distiller), stack=stack,
                        progress=lambda line: print(line, file=sys.stderr, flush=True))
        asked = [dict(file=f.label, conv=a.conversation.key, now=a.conversation.now, question=a.question,
                      candidates=a.candidates, held=a.held, baselines=a.baselines, stranger_best=a.stranger_best)
                 for f in files for a in f.asked]
    with open(args.out, "wb") as handle:
        pickle.dump({"asked": asked}, handle)
    print(f"wrote {args.out}: {len(asked)} questions", file=sys.stderr)


def _prepare(asked: list[dict]) -> list[dict]:
    questions = []
    for a in asked:
        candidates = a["candidates"]
        features = [relevance_features(c.signals) for c in candidates]
        x = np.array([[f[n] for n in FEATURES] for f in features]).reshape(-1, len(FEATURES))
        held = [a["held"].get((c.kind, c.id), frozenset()) for c in candidates]
        prior = np.array([
            math.log(decay_factor((a["now"] - c.refreshed_at).total_seconds() / 86400, HALF_LIFE_DAYS, True))
            + math.log(1 + c.warmth) + math.log(gravity(c.tier, c.user_weight))
            + (math.log(SUPERSEDED_FACTOR) if c.superseded_by else 0.0) for c in candidates])
        best = answerable_features(candidates[0].signals) if candidates else None
        questions.append(dict(
            a, x=x, held=held, prior=prior, tiers=[c.tier for c in candidates],
            y=np.array([1.0 if h & a["question"].evidence else 0.0 for h in held]),
            best=[best[n] for n in ANSWERABLE_FEATURES] if best else None))
    return questions


def _fit_standing(train: list[dict]) -> tuple[float, np.ndarray]:
    rows = [q for q in train if len(q["y"])]
    x, y = np.vstack([q["x"] for q in rows]), np.concatenate([q["y"] for q in rows])
    files = np.concatenate([[q["file"]] * len(q["y"]) for q in rows])
    bias, weights = fit_logistic(x, y, files, FEATURES, NON_NEGATIVE_FEATURES)
    w = np.array([weights[n] for n in FEATURES])
    return bias + operating_point_shift(bias + x @ w, y == 1, files, TRUE_PASS_SHARE), w


def _fit_answerability(questions: list[dict], held_out: set[str]) -> tuple[float, np.ndarray]:
    rows, labels, files = [], [], []
    for q in questions:
        if q["conv"] in held_out:
            continue
        if q["best"] is not None and (q["y"].sum() > 0 or not q["question"].evidence):
            rows.append(q["best"]), labels.append(float(q["y"].sum() > 0)), files.append(q["file"])
        if q["stranger_best"] is not None:
            rows.append(q["stranger_best"]), labels.append(0.0), files.append(q["file"])
    x, y, f = np.array(rows), np.array(labels), np.array(files)
    bias, weights = fit_logistic(x, y, f, ANSWERABLE_FEATURES, frozenset(ANSWERABLE_FEATURES))
    w = np.array([weights[n] for n in ANSWERABLE_FEATURES])
    return bias + operating_point_shift(bias + x @ w, y == 1, f, ANSWERABLE_PASS_SHARE), w


def _ranked(q: dict, standing: tuple[float, np.ndarray], answer: tuple[float, np.ndarray], exponent: float,
            limit: int) -> tuple[list[int], np.ndarray]:
    """The indices recall keeps (gate, then order), and each candidate's ln rank odds."""
    if not len(q["y"]):
        return [], np.zeros(0)
    logit = standing[0] + q["x"] @ standing[1]
    s = 1 / (1 + np.exp(-logit))
    answerable = 1 / (1 + math.exp(-(answer[0] + np.dot(answer[1], q["best"]))))
    score = exponent * logit + q["prior"]
    kept = [i for i in np.argsort(-score, kind="stable")
            if answerable >= THRESHOLD - 1e-9 and passes_tier_gate(float(s[i]), THRESHOLD, q["tiers"][i], 2.0)]
    return kept[:limit], score


def _recall(items: list[frozenset[str]], evidence: frozenset[str]) -> float:
    return len(set().union(*items) & evidence) / len(evidence) if items else 0.0


def curves_command(args: argparse.Namespace) -> None:
    """Cross-validated Recall@10 against the baselines, then the block's precision / recall per odds gap."""
    with open(args.pickle, "rb") as handle:
        questions = _prepare(pickle.load(handle)["asked"])
    convs: dict[str, set[str]] = defaultdict(set)
    for q in questions:
        convs[q["file"]].add(q["conv"])
    files = list(dict.fromkeys(q["file"] for q in questions))
    assignment = assign_folds([(f, len(convs[f])) for f in files], args.folds)
    gaps = (None, 4.0, 2.0, 1.0, 0.5, 0.25)
    recall10: dict[str, list[float]] = defaultdict(list)
    baselines: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    block: dict = {g: defaultdict(lambda: defaultdict(list)) for g in gaps}
    for fold in range(args.folds):
        held_out = {k for k, v in assignment.items() if v == fold}
        standing = _fit_standing([q for q in questions if q["conv"] not in held_out])
        answer = _fit_answerability(questions, held_out)
        for q in questions:
            evidence = q["question"].evidence
            if q["conv"] not in held_out or not evidence:
                continue
            top, _ = _ranked(q, standing, answer, args.exponent, 10)
            recall10[q["file"]].append(_recall([q["held"][i] for i in top], evidence))
            for name, items in q["baselines"].items():
                baselines[name][q["file"]].append(_recall(items[:10], evidence))
            top5, score = _ranked(q, standing, answer, args.exponent, 5)
            for gap in gaps:
                best = max((score[i] for i in top5), default=0.0)
                kept = [i for i in top5 if gap is None or score[i] >= best - gap * args.exponent]
                if not asks_about_past(q["question"].question):
                    kept = [i for i in kept if q["candidates"][i].superseded_by is None]
                stats = block[gap][q["file"]]
                stats["size"].append(len(kept))
                stats["recall"].append(_recall([q["held"][i] for i in kept], evidence))
                if kept:
                    stats["precision"].append(np.mean([float(bool(q["held"][i] & evidence)) for i in kept]))
    print(f"Recall@10, each conversation ranked by a fold model that did not see it (exponent {args.exponent:g}):")
    for f in files:
        best_name = max(baselines, key=lambda n: np.mean(baselines[n][f]))
        yak, base = np.mean(recall10[f]), np.mean(baselines[best_name][f])
        print(f"  {f}: Yak {yak:.3f}, {best_name} {base:.3f} ({(yak - base) * 100:+.1f} points)")
    print("The block (limit 5, superseded left out): precision / recall / size per odds gap:")
    for gap in gaps:
        print(f"  gap {gap}: " + "; ".join(
            f"{f} {np.mean(block[gap][f]['precision']):.3f} / {np.mean(block[gap][f]['recall']):.3f} / "
            f"{np.mean(block[gap][f]['size']):.2f}" for f in files))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    collect = commands.add_parser("collect", help="collect and pickle every dev question's candidates")
    collect.add_argument("--distiller", choices=("rules", "none", "local"), default="rules")
    collect.add_argument("--data", type=Path, action="append", default=None, help="LoCoMo-format files (default: the three dev files)")
    collect.add_argument("--out", type=Path, required=True)
    curves = commands.add_parser("curves", help="cross-validated Recall@10 and the block's curves from a pickle")
    curves.add_argument("pickle", type=Path)
    curves.add_argument("--exponent", type=float, default=30.0)
    curves.add_argument("--folds", type=int, default=5)
    args = parser.parse_args()
    if args.command == "collect":
        args.data = args.data or list(DEV_FILES)
        collect_command(args)
    else:
        curves_command(args)


if __name__ == "__main__":
    main()
