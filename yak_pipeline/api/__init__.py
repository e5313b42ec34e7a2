"""Yak's HTTP API (FastAPI): ``create_app`` in :mod:`yak_pipeline.api.app`."""
