"""Any OpenAI-compatible ``/v1/embeddings`` endpoint (OpenAI, Ollama, vLLM, llama.cpp …)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import openai

from yak_pipeline.embeddings.protocol import EmbeddingError
from yak_pipeline.embeddings.usage import count_documents


class OpenAIEmbedder:
    """Embeddings from an OpenAI-compatible endpoint, normalised to unit length."""

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        dimensions: int | None = None,
        timeout_seconds: float = 60.0,
        max_retries: int = 3,
        batch_size: int = 128,
    ) -> None:
        self._client = openai.OpenAI(
            base_url=base_url, api_key=api_key or "not-needed", timeout=timeout_seconds, max_retries=max_retries
        )
        self._model = model
        self._dimensions = dimensions
        self._batch_size = batch_size

    @property
    def model_name(self) -> str:
        """The endpoint's model name."""
        return self._model

    @property
    def dimensions(self) -> int:
        """Vector size: configured, or learnt from the endpoint with one probe request."""
        if self._dimensions is None:
            self._dimensions = len(self._request(["dimension probe"])[0])
        return self._dimensions

    def _request(self, texts: list[str]) -> list[list[float]]:
        try:
            response = self._client.embeddings.create(model=self._model, input=texts)
        except openai.OpenAIError as exc:
            raise EmbeddingError(f"embedding endpoint failed: {type(exc).__name__}: {str(exc)[:200]}") from None
        rows = sorted(response.data, key=lambda d: d.index)
        if len(rows) != len(texts):
            raise EmbeddingError(f"embedding endpoint returned {len(rows)} vectors for {len(texts)} texts")
        vectors = []
        for row in rows:
            norm = math.sqrt(sum(v * v for v in row.embedding))
            if norm == 0.0 or not math.isfinite(norm):
                raise EmbeddingError("embedding endpoint returned a zero or non-finite vector")
            vectors.append([v / norm for v in row.embedding])
        return vectors

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed many texts in batches; every vector must have the configured size."""
        vectors: list[list[float]] = []
        for start in range(0, len(texts), self._batch_size):
            vectors.extend(self._request(list(texts[start : start + self._batch_size])))
        expected = self.dimensions
        for vector in vectors:
            if len(vector) != expected:
                raise EmbeddingError(f"embedding endpoint returned {len(vector)} dimensions, expected {expected}")
        count_documents(len(vectors))
        return vectors

    def embed_query(self, text: str) -> list[float]:
        """Embed one query."""
        return self.embed_documents([text])[0]
