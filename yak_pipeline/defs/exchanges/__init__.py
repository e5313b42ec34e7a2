"""Dagster definitions for raw exchanges: the drop folder, the ingest asset and its sensors."""
