"""The history-file formats Yak reads, parsed without any disk I/O and without the store: bytes in,
exchange records (or rejected records with reasons) out.

- :mod:`~yak_pipeline.ingestion.formats.history_files` — which format a file holds, and its exchanges;
- :mod:`~yak_pipeline.ingestion.formats.exchange_files` — Yak's own drop files, ``.jsonl`` and ``.json``
  (:mod:`~yak_pipeline.ingestion.formats.yak_json`) and ``.md`` (:mod:`~yak_pipeline.ingestion.formats.yak_markdown`);
- :mod:`~yak_pipeline.ingestion.formats.chatgpt_export`, :mod:`~yak_pipeline.ingestion.formats.claude_export`
  — the ChatGPT and Claude.ai data exports' conversations;
- :mod:`~yak_pipeline.ingestion.formats.claude_code_sessions` — Claude Code session transcripts;
- :mod:`~yak_pipeline.ingestion.formats.exchange_records` — what every reader yields (records, rejected
  records, a fatal reason) and the checks they share.
"""
