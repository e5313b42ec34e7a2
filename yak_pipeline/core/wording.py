"""How confirmations read to a person, the same on the page and in the CLI: counts in words
("1 memory", "3 memories", never "memory(ies)") and what a pin means for recall ("counts twice
as much", not "user_weight 1 → 2")."""

from __future__ import annotations


def plural(count: int, word: str, words: str | None = None) -> str:
    """``1 memory``, ``3 memories`` (``words`` when adding an "s" is wrong)."""
    return f"{count} {word if count == 1 else words or word + 's'}"


def times_as_much(weight: float) -> str:
    """A user_weight as a share of recall's gravity: "twice as much", "0.5 times as much"."""
    if weight == 1:
        return "as much as any other"
    return "twice as much" if weight == 2 else f"{weight:g} times as much"


def weight_note(before: float | None, after: float) -> str:
    """What setting a distillation's weight did, in the terms of recall (gravity is tier × weight).

    ``before`` None: the previous weight is not known (the CLI sees only the result)."""
    if after == before:
        return f"unchanged: this memory already counts {times_as_much(after)} in recall"
    if after == 1:
        return "unpinned: this memory counts as much as any other in recall"
    return f"{'pinned' if after > 1 else 'weighted down'}: this memory counts {times_as_much(after)} in recall"
