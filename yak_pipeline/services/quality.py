"""The distillation quality gate, validated with Great Expectations (DESIGN §5).

Expectations on a partition's distillations: confidence in [0, 1]; tier in the set; 1–4
sentences; an embedding of the database's dimension; no ``active`` row under the 0.6 gate.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

import pandas as pd

from yak_pipeline.core.gates import REVIEW_CONFIDENCE
from yak_pipeline.core.sentences import count_sentences
from yak_pipeline.core.types import TIERS


@dataclass(frozen=True)
class QualityOutcome:
    """The gate's verdict on one partition."""

    passed: bool
    rows: int
    failures: tuple[str, ...]


def distillation_frame(rows: list[dict]) -> pd.DataFrame:
    """The columns the expectations look at, derived from distillation rows."""
    return pd.DataFrame({
        "id": [str(r["id"]) for r in rows],
        "confidence": [r["confidence"] for r in rows],
        "tier": [r["tier"] for r in rows],
        "sentences": [count_sentences(r["content"]) for r in rows],
        "embedding_dim": [r["embedding_dim"] for r in rows],
        "active_below_gate": [r["status"] == "active" and r["confidence"] < REVIEW_CONFIDENCE for r in rows],
    })


@lru_cache(maxsize=1)
def _batch_definition():  # noqa: ANN202 - GX types are heavy to import at module load
    # Great Expectations reports usage to its vendor by default; a personal memory system must not.
    # Set here, before GX is first used, not when this module is imported (importing changes nothing).
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    # Validation runs inside pipeline runs and tests: no progress bars on their logs.
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = context.data_sources.add_pandas("yak")
    asset = source.add_dataframe_asset("distillations")
    return asset.add_batch_definition_whole_dataframe("partition")


def _suite(dimensions: int):  # noqa: ANN202
    import great_expectations as gx

    suite = gx.ExpectationSuite(name=f"distillations_{dimensions}")
    suite.add_expectation(gx.expectations.ExpectColumnValuesToBeBetween(column="confidence", min_value=0, max_value=1))
    suite.add_expectation(gx.expectations.ExpectColumnValuesToNotBeNull(column="confidence"))
    suite.add_expectation(gx.expectations.ExpectColumnValuesToBeInSet(column="tier", value_set=list(TIERS)))
    suite.add_expectation(gx.expectations.ExpectColumnValuesToBeBetween(column="sentences", min_value=1, max_value=4))
    suite.add_expectation(gx.expectations.ExpectColumnValuesToNotBeNull(column="embedding_dim"))
    suite.add_expectation(gx.expectations.ExpectColumnValuesToBeInSet(column="embedding_dim", value_set=[dimensions]))
    suite.add_expectation(gx.expectations.ExpectColumnValuesToBeInSet(column="active_below_gate", value_set=[False]))
    return suite


def validate_distillations(rows: list[dict], *, dimensions: int) -> QualityOutcome:
    """Run the expectations over a partition's distillations."""
    if not rows:
        return QualityOutcome(passed=True, rows=0, failures=())
    frame = distillation_frame(rows)
    batch = _batch_definition().get_batch(batch_parameters={"dataframe": frame})
    result = batch.validate(_suite(dimensions))
    failures = []
    for check in result.results:
        if not check.success:
            config = check.expectation_config
            unexpected = check.result.get("partial_unexpected_list", [])[:5]
            failures.append(f"{config.type} on {config.kwargs.get('column')}: unexpected {unexpected}")
    return QualityOutcome(passed=bool(result.success), rows=len(rows), failures=tuple(failures))
