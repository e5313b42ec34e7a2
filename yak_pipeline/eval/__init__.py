"""Retrieval evaluation: LoCoMo-format conversations, four recall methods, ranking metrics.

- :mod:`yak_pipeline.eval.locomo` reads a LoCoMo-format file and maps each turn to an exchange;
- :mod:`yak_pipeline.eval.metrics` scores one ranking against evidence turns and aggregates;
- :mod:`yak_pipeline.eval.runner` ingests into a fresh database and runs the methods;
- :mod:`yak_pipeline.eval.report` prints the table and writes the JSON and the PNG chart.
"""
