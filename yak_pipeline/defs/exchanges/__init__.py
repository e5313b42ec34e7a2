"""Dagster definitions for raw exchanges: the ``raw_exchanges`` asset (ingestion itself: ``yak_pipeline.ingestion``)."""
