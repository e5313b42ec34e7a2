"""The operations Dagster assets, the API and the CLI share: distil, dedup, warmth, recall.

Ingestion (drop folder, import, storing exchanges) is its own package, :mod:`yak_pipeline.ingestion`.

Each is a plain function over a :class:`~yak_pipeline.store.database.Database`, an LLM provider
and an embedder, so the asset, the route and the command are thin shells over one code path.
"""
