"""Sentence splitting, shared by the distillation output model, the quality check and the rules provider."""

from __future__ import annotations

import re

# A sentence ends at . ! or ? followed by whitespace and an upper-case letter, digit or quote.
# Abbreviations such as "Dr." or "e.g." are protected so they do not split a sentence.
_ABBREVIATIONS = ("mr.", "mrs.", "ms.", "dr.", "prof.", "st.", "jr.", "sr.", "e.g.", "i.e.", "etc.", "vs.", "no.")
_BOUNDARY = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """Split ``text`` into sentences; blank text gives an empty list."""
    text = " ".join(text.split())
    if not text:
        return []
    pieces: list[str] = []
    buffer = ""
    for part in _BOUNDARY.split(text):
        buffer = f"{buffer} {part}".strip() if buffer else part.strip()
        if not buffer.lower().endswith(_ABBREVIATIONS):
            pieces.append(buffer)
            buffer = ""
    if buffer:
        pieces.append(buffer)
    return [p for p in pieces if p]


def count_sentences(text: str) -> int:
    """Number of sentences in ``text``."""
    return len(split_sentences(text))
