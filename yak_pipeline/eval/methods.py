"""The retrieval methods under evaluation: the two baselines, Yak three ways, and the ablations."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from yak_pipeline.core.recall import RecallParams
from yak_pipeline.eval.options import EvalOptions
from yak_pipeline.wiring import YakParts

MethodKind = Literal["bm25", "dense", "yak", "yak_judged"]
# Which model ranks a Yak method: the conversation's fold model, the in-sample fit, the installed one.
ModelRole = Literal["cross_validated", "in_sample", "shipped"]

BASELINES = ("BM25", "dense")
YAK = "Yak"
YAK_IN_SAMPLE = "Yak (in-sample)"
YAK_SHIPPED = "Yak (shipped model)"
YAK_NO_QUERY_PARTS = "Yak, no query parts"
YAK_NO_UPDATE_READING = "Yak, no update reading"
YAK_JUDGED = "Yak + LLM judge"


@dataclass(frozen=True)
class Method:
    """One retrieval method under evaluation."""

    name: str
    kind: MethodKind
    params: RecallParams | None = None
    note: str = ""
    model: ModelRole = "cross_validated"
    # An ablation runs the live recall (its parameters can change the candidates), not a re-ranking.
    live: bool = False


def build_methods(parts: YakParts, options: EvalOptions) -> list[Method]:
    """BM25, dense, Yak three ways (cross-validated, in-sample, shipped), and with
    ``options.ablations`` variants of the cross-validated Yak."""
    depth = max(options.ks)
    settings = parts.settings
    base = parts.recall_params(threshold=options.threshold, limit=depth)
    methods = [
        Method("BM25", "bm25", note="Okapi BM25 over raw exchanges (PostgreSQL full text)"),
        Method("dense", "dense", note="exact cosine over raw exchanges, same embedder"),
        Method(YAK, "yak", base, model="cross_validated",
               note="the default recall, each conversation ranked by a relevance model fitted without it"),
        Method(YAK_IN_SAMPLE, "yak", base, model="in_sample",
               note="the default recall with a relevance model fitted on all these conversations"),
        Method(YAK_SHIPPED, "yak", base, model="shipped",
               note="the default recall with the installed relevance model (recall_models)"),
        Method(YAK_NO_QUERY_PARTS, "yak", replace(base, query_parts=False), model="cross_validated",
               note="the default recall, cross-validated, without recalling for each thing a question lists "
                    "(YAK_RECALL_QUERY_PARTS=false)"),
        Method(YAK_NO_UPDATE_READING, "yak", replace(base, updates_first=False), model="cross_validated",
               note="the default recall, cross-validated, without moving a memory that announces a new value "
                    "ahead of older ones (core.updates)"),
    ]
    if options.llm_judge:
        methods.append(Method(YAK_JUDGED, "yak_judged", base,
                              note="the cross-validated recall, then the LLM drops what it judges irrelevant"))
    if options.ablations:
        def variant(name: str, params: RecallParams) -> Method:
            return Method(name, "yak", params, live=True)

        methods += [
            variant("Yak, no gate", replace(base, gate=False)),
            variant("Yak, decay off", replace(base, decay_enabled=False)),
            *[variant(f"Yak, half-life {days:g} d", replace(base, decay_enabled=True, half_life_days=days))
              for days in (7.0, 90.0, 365.0) if not (settings.decay_enabled and days == settings.half_life_days)],
            *[variant(f"Yak, relevance exponent {e:g}", replace(base, relevance_exponent=e))
              for e in (3.0, 6.0, 12.0, 24.0) if e != base.relevance_exponent],
            variant("Yak, supersession ignored", replace(base, superseded_factor=1.0)),
            variant("Yak, exchange context off", replace(base, exchange_context=False)),
            variant("Yak, present questions by score", replace(base, present_newest_first=False)),
            variant("Yak, legs of 20", replace(base, leg_size=20)),
        ]
    return methods
