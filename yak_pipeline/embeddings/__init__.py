"""Embedders: one protocol, three providers (local MiniLM, OpenAI-compatible, feature hashing)."""

from yak_pipeline.embeddings.factory import get_embedder
from yak_pipeline.embeddings.protocol import Embedder, EmbeddingError

__all__ = ["Embedder", "EmbeddingError", "get_embedder"]
