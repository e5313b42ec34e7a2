"""Dagster definitions for Yak: one folder per concept (exchanges, distillations, scores, automation)."""
