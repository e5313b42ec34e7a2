"""The metric catalogue is consistent: what /metrics renders from it can always be rendered."""

from __future__ import annotations

from yak_pipeline.core.metric_catalogue import METRICS, METRICS_BY_NAME, QUEUES


def test_every_metric_is_named_once_and_prometheus_style() -> None:
    assert len(METRICS_BY_NAME) == len(METRICS)
    assert all(m.name.startswith("yak_") and m.help.endswith(".") for m in METRICS)


def test_known_series_give_a_value_for_every_label() -> None:
    for metric in METRICS:
        assert len(set(metric.labels)) == len(metric.labels), metric.name
        assert all(len(values) == len(metric.labels) for values in metric.known), metric.name
        assert [set(series) for series in metric.known_label_values] == [set(metric.labels)] * len(metric.known)


def test_only_histograms_have_buckets_and_theirs_rise() -> None:
    for metric in METRICS:
        if metric.kind == "histogram":
            assert metric.buckets and list(metric.buckets) == sorted(set(metric.buckets)), metric.name
        else:
            assert metric.buckets == (), metric.name


def test_the_queue_gauge_reports_every_queue() -> None:
    gauge = METRICS_BY_NAME["yak_queue_size"]
    assert gauge.kind == "gauge" and gauge.labels == ("queue",)
    assert [values[0] for values in gauge.known] == list(QUEUES)
