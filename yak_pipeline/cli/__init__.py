"""The ``yak`` command: a thin client of the API, plus local administration."""
