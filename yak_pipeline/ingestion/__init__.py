"""Ingestion: from a dropped or imported history file to stored ``pending`` exchanges, in one place.

The path of a file, each step in its own module:

- :mod:`~yak_pipeline.ingestion.drop_folder` — the drop folder on disk: which files are ready
  (and for which user folder), moving a read file to ``processed/``, quarantining a file or its
  bad records in ``failed/``;
- :mod:`~yak_pipeline.ingestion.formats` — parsing, pure (bytes in, records out; no disk I/O, no
  store): :mod:`~yak_pipeline.ingestion.formats.history_files` tells a file's format and parses
  it, :mod:`~yak_pipeline.ingestion.formats.exchange_files` reads Yak's own formats;
- :mod:`~yak_pipeline.ingestion.records` — storing parsed records as memories, idempotent on the
  content hash, every record stored, found already there, or rejected with its reason;
- :mod:`~yak_pipeline.ingestion.history` — one file imported: format, resumable sessions,
  batched storing (``yak import`` and the drop folder);
- :mod:`~yak_pipeline.ingestion.claim` — one pass over the drop folder: import each ready file,
  then move it (stored before moved, so a crash re-reads the file and stores nothing twice).

Nothing here imports Dagster or ``defs/``: the drop-folder sensor, ``yak process`` and ``yak
import`` are shells over these functions.
"""
