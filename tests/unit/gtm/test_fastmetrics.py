"""gtm.fastmetrics: the lock-free counter and histogram scrape exactly as prometheus_client's."""

from __future__ import annotations

import math
import time

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from gtm.fastmetrics import FastCounter, FastHistogram

BUCKETS = (0.0001, 0.001, 0.01, 0.1, 1.0, 10.0)
#: Values on, between, below and beyond the bounds, and the infinities.
VALUES = (0.0, 0.0001, 0.00011, 0.001, 0.5, 1.0, 9.99, 10.0, 11.0, -3.0, math.inf, -math.inf)


def _drive(counter: type[Counter], histogram: type[Histogram]) -> CollectorRegistry:
    registry = CollectorRegistry()
    plain = counter("t_plain", "A counter without labels.", registry=registry)
    labelled = counter("t_requests", "By route and status.", ["route", "status"], registry=registry)
    counter("t_unused", "A labelled counter never incremented.", ["gpu"], registry=registry)
    whole = histogram("t_overhead_seconds", "No labels.", buckets=BUCKETS, registry=registry)
    by_model = histogram(
        "t_first_byte_seconds", "By model.", ["model"], buckets=BUCKETS, registry=registry
    )
    for i, value in enumerate(VALUES * 3):
        plain.inc()
        labelled.labels("/v1/chat/completions", 200 + i % 3).inc()
        labelled.labels(route="/v1/completions", status="200").inc(2.5)
        whole.observe(value)
        by_model.labels(("m-a", "m-b")[i % 2]).observe(value)
    return registry


@pytest.fixture
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same ``_created`` timestamp for every series, whichever class made it."""
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.25)


@pytest.mark.usefixtures("frozen_clock")
def test_the_exposition_is_prometheus_clients_byte_for_byte() -> None:
    reference = _drive(Counter, Histogram)
    fast = _drive(FastCounter, FastHistogram)
    assert generate_latest(fast) == generate_latest(reference)
    assert generate_openmetrics(fast) == generate_openmetrics(reference)  # type: ignore[no-untyped-call]
    assert b't_first_byte_seconds_bucket{le="0.0001",model="m-a"} 3.0' in generate_latest(fast)


@pytest.mark.usefixtures("frozen_clock")
def test_without_created_series_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prometheus_metrics, "_use_created", False)
    fast = generate_latest(_drive(FastCounter, FastHistogram))
    assert fast == generate_latest(_drive(Counter, Histogram))
    assert b"_created" not in fast


def test_nan_goes_to_the_sum_only_as_in_prometheus_client() -> None:
    registry = CollectorRegistry()
    fast = FastHistogram("t_fast", "d", buckets=BUCKETS, registry=registry)
    reference = Histogram("t_reference", "d", buckets=BUCKETS, registry=registry)
    for metric in (fast, reference):
        metric.observe(math.nan)
        metric.observe(0.5)
    for name in ("t_fast", "t_reference"):
        assert registry.get_sample_value(f"{name}_count") == 1.0
        assert math.isnan(registry.get_sample_value(f"{name}_sum") or 0.0)


def test_misuse_raises_as_prometheus_client_does() -> None:
    registry = CollectorRegistry()
    labelled = FastCounter("t_c", "d", ["gpu"], registry=registry)
    histogram = FastHistogram("t_h", "d", ["gpu"], registry=registry)
    with pytest.raises(ValueError, match="counter metric is missing label values"):
        labelled.inc()
    with pytest.raises(ValueError, match="histogram metric is missing label values"):
        histogram.observe(1.0)
    with pytest.raises(ValueError, match="non-negative"):
        labelled.labels("g").inc(-1)
    with pytest.raises(ValueError, match="exemplars are not kept"):
        histogram.labels("g").observe(1.0, {"trace_id": "x"})


def test_the_registry_refuses_a_second_collector_of_the_same_name() -> None:
    registry = CollectorRegistry()
    FastHistogram("t_same", "d", registry=registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Histogram("t_same", "d", registry=registry)


def test_reset_starts_the_count_again() -> None:
    registry = CollectorRegistry()
    counter = FastCounter("t_reset", "d", registry=registry)
    counter.inc(3)
    counter.reset()
    counter.inc()
    assert registry.get_sample_value("t_reset_total") == 1.0


def test_labels_answers_the_same_child_until_it_is_removed() -> None:
    registry = CollectorRegistry()
    counter = FastCounter("t_by", "d", ["route", "status"], registry=registry)
    child = counter.labels("/v1/chat/completions", 200)
    assert counter.labels("/v1/chat/completions", 200) is child
    assert counter.labels("/v1/chat/completions", "200") is child  # one series, as str
    assert counter.labels(route="/v1/chat/completions", status="200") is child
    child.inc()
    labels = {"route": "/v1/chat/completions", "status": "200"}
    assert registry.get_sample_value("t_by_total", labels) == 1.0
    counter.remove("/v1/chat/completions", "200")
    assert registry.get_sample_value("t_by_total", labels) is None
    fresh = counter.labels("/v1/chat/completions", 200)
    assert fresh is not child
    fresh.inc()
    counter.clear()
    assert counter.labels("/v1/chat/completions", 200) is not fresh
    assert registry.get_sample_value("t_by_total", labels) == 0.0
    histogram = FastHistogram("t_h_by", "d", ["model"], registry=registry)
    observed = histogram.labels("m")
    histogram.remove_by_labels({"model": "m"})
    assert histogram.labels("m") is not observed


def test_labels_refuses_what_prometheus_client_refuses() -> None:
    counter = FastCounter("t_refused", "d", ["gpu"], registry=CollectorRegistry())
    with pytest.raises(ValueError, match="Incorrect label count"):
        counter.labels("a", "b")
    with pytest.raises(ValueError, match="can not chain"):
        counter.labels("a").labels("b")
    assert counter.labels(["unhashable"]) is counter.labels(["unhashable"])
