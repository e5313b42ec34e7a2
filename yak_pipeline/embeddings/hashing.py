"""A fast, deterministic feature-hashing embedder for minimal installs and quick tests.

It is not a semantic model: texts that share words get similar vectors, nothing more.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence

from yak_pipeline.embeddings.usage import count_documents

_TOKEN = re.compile(r"[a-z0-9]+")


class HashingEmbedder:
    """Signed feature hashing of word unigrams and bigrams into ``dimensions`` buckets."""

    def __init__(self, dimensions: int = 384) -> None:
        if dimensions < 8:
            raise ValueError("hashing embedder needs at least 8 dimensions")
        self._dimensions = dimensions

    @property
    def model_name(self) -> str:
        """Named as what it is, so its vectors are never mistaken for a semantic model's."""
        return f"feature-hashing-{self._dimensions}"

    @property
    def dimensions(self) -> int:
        """Vector size."""
        return self._dimensions

    def _embed(self, text: str) -> list[float]:
        tokens = _TOKEN.findall(text.lower())
        features = tokens + [f"{a} {b}" for a, b in zip(tokens, tokens[1:])]
        vector = [0.0] * self._dimensions
        for feature in features:
            digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
            bucket = int.from_bytes(digest[:4], "little") % self._dimensions
            vector[bucket] += 1.0 if digest[4] & 1 else -1.0
        norm = math.sqrt(sum(v * v for v in vector))
        if norm == 0.0:
            # An empty text still needs a valid unit vector; a fixed one keeps it deterministic.
            vector[0] = 1.0
            return vector
        return [v / norm for v in vector]

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed many texts."""
        vectors = [self._embed(t) for t in texts]
        count_documents(len(vectors))
        return vectors

    def embed_query(self, text: str) -> list[float]:
        """Embed one query."""
        return self._embed(text)
