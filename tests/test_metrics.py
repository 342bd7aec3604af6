"""The metrics endpoint serves what the pipeline recorded, in Prometheus' text format."""

from __future__ import annotations

import urllib.request

from pgcdc.metrics import PipelineMetrics


def test_metrics_are_served() -> None:
    metrics = PipelineMetrics("slot_a")
    port = metrics.serve(0, addr="127.0.0.1")
    try:
        metrics.record_batch(0.3, {("public.orders", "I"): 5, ("public.orders", "D"): 1}, 2)
        metrics.record_batch(1.5, {("public.orders", "I"): 2})
        metrics.record_lag(lag_bytes=4096, lag_seconds=1.25, retained_bytes=1 << 20)
        metrics.record_error("connection")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            body = resp.read().decode()
    finally:
        metrics.close()
    assert 'pgcdc_changes_total{op="I",slot="slot_a",table="public.orders"} 7.0' in body
    assert 'pgcdc_changes_total{op="D",slot="slot_a",table="public.orders"} 1.0' in body
    assert 'pgcdc_transactions_total{slot="slot_a"} 2.0' in body
    assert 'pgcdc_batches_total{slot="slot_a"} 2.0' in body
    assert 'pgcdc_batch_duration_seconds_bucket{le="0.5",slot="slot_a"} 1.0' in body
    assert 'pgcdc_lag_bytes{slot="slot_a"} 4096.0' in body
    assert 'pgcdc_retained_wal_bytes{slot="slot_a"} 1.048576e+06' in body
    assert 'pgcdc_errors_total{kind="connection",slot="slot_a"} 1.0' in body


def test_registries_are_separate() -> None:
    a, b = PipelineMetrics("a"), PipelineMetrics("b")
    a.record_error("x")
    assert b.registry.get_sample_value("pgcdc_errors_total", {"slot": "b", "kind": "x"}) is None
    assert a.registry.get_sample_value("pgcdc_errors_total", {"slot": "a", "kind": "x"}) == 1.0
