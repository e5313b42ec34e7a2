"""Retrieval evaluation: LoCoMo-format conversations, the recall methods, ranking metrics.

- :mod:`yak_pipeline.eval.locomo` reads a LoCoMo-format file and maps its turns to exchanges (a
  user turn and the assistant's reply as one exchange where the second speaker is an assistant);
- :mod:`yak_pipeline.eval.metrics` scores one ranking against evidence turns and aggregates;
- :mod:`yak_pipeline.eval.runner` ingests each file into a fresh database, asks every question
  once, fits the relevance models (conversation-level cross-validation, in-sample) and scores
  BM25, dense and Yak per file;
- :mod:`yak_pipeline.eval.calibrate` fits the relevance model (``yak eval calibrate``) on the
  runner's examples;
- :mod:`yak_pipeline.eval.report` prints the tables and writes the JSON and the PNG chart.
"""
