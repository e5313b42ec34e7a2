"""Dagster definitions for scores: conflicts, near-duplicate versions and warmth."""
