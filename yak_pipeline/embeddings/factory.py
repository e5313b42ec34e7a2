"""Builds the configured embedder (one instance per process and configuration)."""

from __future__ import annotations

from functools import lru_cache

from yak_pipeline.embeddings.protocol import Embedder
from yak_pipeline.settings import Settings, SettingsError


@lru_cache(maxsize=8)
def get_embedder(settings: Settings) -> Embedder:
    """The embedder ``YAK_EMBEDDER`` names, cached so the local model loads once per process."""
    if settings.embedder == "hashing":
        from yak_pipeline.embeddings.hashing import HashingEmbedder

        return HashingEmbedder(settings.embed_dimensions or 384)
    if settings.embedder == "openai":
        from yak_pipeline.embeddings.openai_embedder import OpenAIEmbedder

        base_url = settings.embed_base_url or settings.llm_base_url
        if not base_url:
            raise SettingsError("YAK_EMBEDDER=openai needs YAK_EMBED_BASE_URL or YAK_LLM_BASE_URL")
        if not settings.embed_model:
            raise SettingsError("YAK_EMBEDDER=openai needs YAK_EMBED_MODEL (e.g. nomic-embed-text)")
        key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
        return OpenAIEmbedder(
            base_url=base_url,
            model=settings.embed_model,
            api_key=key,
            dimensions=settings.embed_dimensions,
            timeout_seconds=settings.llm_timeout_seconds,
            max_retries=settings.llm_max_retries,
        )
    from yak_pipeline.embeddings.local import LocalMiniLMEmbedder

    return LocalMiniLMEmbedder()
