"""Retrieval evaluation: LoCoMo-format conversations, the recall methods, ranking metrics.

- :mod:`yak_pipeline.eval.locomo` reads a LoCoMo-format file and maps its turns to exchanges (a
  user turn and the assistant's reply as one exchange where the second speaker is an assistant);
  :mod:`yak_pipeline.eval.superseded` guesses the turn a knowledge update replaced;
- :mod:`yak_pipeline.eval.options` holds a run's options and :mod:`yak_pipeline.eval.methods` the
  methods under evaluation (BM25, dense, Yak three ways, the ablations);
- :mod:`yak_pipeline.eval.scratch_database` makes each file's fresh database,
  :mod:`yak_pipeline.eval.ingest` puts its conversations through the real pipeline, and
  :mod:`yak_pipeline.eval.collection` asks every question once (baselines and Yak's candidates);
- :mod:`yak_pipeline.eval.examples` labels the collected candidates as the relevance model's
  examples, :mod:`yak_pipeline.eval.calibrate` fits the model (``yak eval calibrate``) and
  :mod:`yak_pipeline.eval.cross_validation` fits one per conversation-level fold;
- :mod:`yak_pipeline.eval.ranking` ranks each asked question by each method,
  :mod:`yak_pipeline.eval.metrics` scores one ranking against evidence turns and aggregates,
  :mod:`yak_pipeline.eval.block_measures` measures the block a prompt would get, and
  :mod:`yak_pipeline.eval.file_report` gathers one file's figures;
- :mod:`yak_pipeline.eval.runner` runs those stages in order (``run_evaluation``);
- :mod:`yak_pipeline.eval.report` prints the tables and writes the JSON and the PNG chart.
"""
