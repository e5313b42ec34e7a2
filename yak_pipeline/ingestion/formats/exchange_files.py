"""Parsing exchange files dropped into the drop folder (.jsonl, .json, .md), without any disk I/O.

The caller hands over a file's name and bytes and gets back a :class:`ParsedFile`:

- ``records`` — the exchanges that passed validation, content in ``User: …\\nAssistant: …`` form;
- ``rejected`` — each bad record with its source line, its raw text and a one-line reason, so the
  caller can quarantine it instead of dropping it;
- ``fatal`` — set (``"line N: reason"``) when the file as a whole cannot be read: not UTF-8, empty,
  invalid JSON in a .json file, a transcript without front matter or without any exchange.

Formats:

- ``.jsonl`` — one JSON object per line; blank lines are skipped. Each object holds ``user_id`` and
  either ``user`` + ``assistant`` strings or ``content`` in ``User: …\\nAssistant: …`` form, plus
  an optional ``occurred_at`` (ISO-8601 date or datetime). Other keys are ignored. A bad record's
  reason names its field (``assistant: field required``): the objects are validated by pydantic
  models (:mod:`~yak_pipeline.ingestion.formats.record_fields`).
- ``.json`` — one such object, or a list of them (``line`` is then the item's index + 1).
- ``.md`` — YAML front matter between ``---`` lines with ``user_id:`` and ``date:`` (other keys
  ignored; YAML that does not parse is fatal, with its line), then blocks that
  start with a line beginning ``User:`` or ``Assistant:`` and run, over any number of lines, to the
  next such line. Each User block followed by an Assistant block is one exchange, dated ``date``.
  Text before the first block (a title, say) is not an exchange and is ignored.

A ``default_user`` (``yak import --user``, a drop-folder user folder) stands in for a missing
``user_id``; a record naming another user is rejected. Exports of other tools (ChatGPT, Claude)
are read by :mod:`yak_pipeline.ingestion.formats.history_files`, which falls back to this module for Yak's own.

Parsing never raises, whatever the bytes: any problem becomes a rejected record or ``fatal``.
"""

from __future__ import annotations

from typing import Final

from yak_pipeline.ingestion.formats.exchange_records import (
    DEFAULT_MAX_RECORD_CHARS,
    FatalError,
    ParsedFile,
    decode_text,
    one_line,
)
from yak_pipeline.ingestion.formats.yak_json import JSON_WHITESPACE, parse_json, parse_jsonl
from yak_pipeline.ingestion.formats.yak_markdown import parse_markdown

SUPPORTED_SUFFIXES: Final[tuple[str, ...]] = (".jsonl", ".json", ".md")


def exchange_file_suffix(name: str) -> str | None:
    """The supported suffix of ``name`` in lower case (``".jsonl"``, ``".json"``, ``".md"``), else None."""
    dot = name.rfind(".")
    suffix = name[dot:].lower() if dot > 0 else ""
    return suffix if suffix in SUPPORTED_SUFFIXES else None


def parse_exchange_file(name: str, data: bytes, *, max_record_chars: int = DEFAULT_MAX_RECORD_CHARS,
                        default_user: str | None = None) -> ParsedFile:
    """Parse one dropped file's bytes into records, rejected records, or a fatal reason; never raises.

    The format is chosen by the suffix of ``name``. A record longer than ``max_record_chars``
    characters is rejected rather than parsed, so one enormous line cannot stall ingestion.
    ``default_user`` (``yak import --user``, a drop-folder user folder) is the user of records
    and transcripts that name none; one that names another user is rejected.
    """
    suffix = exchange_file_suffix(name)
    if suffix is None:
        supported = ", ".join(SUPPORTED_SUFFIXES)
        return ParsedFile(fatal=one_line(f"unsupported file type {name!r}: use one of {supported}"))
    try:
        text = decode_text(data)
        if not text.strip(JSON_WHITESPACE):
            raise FatalError(1, "file is empty")
        if suffix == ".jsonl":
            return parse_jsonl(text, max_record_chars, default_user)
        if suffix == ".json":
            return parse_json(text, max_record_chars, default_user)
        return parse_markdown(text, max_record_chars, default_user)
    except FatalError as error:
        return ParsedFile(fatal=one_line(str(error)))
