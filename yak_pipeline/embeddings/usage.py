"""How many document texts this process has embedded: the embedding work a run did.

Embedding is most of what ingest costs on a CPU, so a run's report says how much of it there was
(``yak process --json``: ``documents_embedded``), and ``bench/ingest_throughput.py`` divides it
by the exchanges to know how many texts each exchange costs. Every provider counts the texts of
each ``embed_documents`` call that returned vectors (queries are not counted).
"""

from __future__ import annotations

import threading

_LOCK = threading.Lock()
_DOCUMENTS = 0


def count_documents(texts: int) -> None:
    """Add ``texts`` embedded documents to this process's count."""
    global _DOCUMENTS
    with _LOCK:
        _DOCUMENTS += texts


def documents_embedded() -> int:
    """The document texts this process has embedded so far."""
    with _LOCK:
        return _DOCUMENTS
