"""Dagster automation: jobs, sensors and the nightly schedule."""
