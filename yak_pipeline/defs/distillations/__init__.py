"""Dagster definitions for distillations: the distil asset and its quality gate."""
