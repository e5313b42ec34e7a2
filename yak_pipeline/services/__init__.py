"""The operations Dagster assets, the API and the CLI share: ingest, distil, dedup, warmth, recall.

Each is a plain function over a :class:`~yak_pipeline.store.database.Database`, an LLM provider
and an embedder, so the asset, the route and the command are thin shells over one code path.
"""
