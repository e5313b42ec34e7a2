"""Errors the store raises, each with a one-line message that says what to do."""

from __future__ import annotations


class StoreError(RuntimeError):
    """Base class of store errors."""


class DatabaseUnavailable(StoreError):
    """The database cannot be reached (or went away mid-operation)."""


class EmbeddedDataOtherVersion(DatabaseUnavailable):
    """The embedded data directory was written by another PostgreSQL major version."""


class SchemaMismatch(StoreError):
    """The database was set up for something else than the current configuration."""


class PgvectorMissing(StoreError):
    """The PostgreSQL server has no pgvector extension."""


class NotFound(StoreError):
    """No row with that id for that user (also raised for another user's id: no hint it exists)."""
