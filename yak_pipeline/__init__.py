"""Yak: a personal memory system for LLMs, built as a Dagster project on PostgreSQL + pgvector."""

__version__ = "0.1.0"
