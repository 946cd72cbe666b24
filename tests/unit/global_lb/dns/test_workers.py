"""The DNS worker pool's counter reports and their merging into the parent's metrics."""

from __future__ import annotations

from prometheus_client import Counter

from global_lb.dns.workers import (
    CounterMerger,
    CounterSample,
    counter_samples,
    decode_report,
    encode_report,
    global_counters,
)
from global_lb.metrics import GlobalMetrics
from gtm.metrics import new_registry

RESPONSES = "gtm_global_dns_responses_total"


def _value(metrics: GlobalMetrics, *labels: str) -> float:
    return float(metrics.dns_responses.labels(*labels)._value.get())


def test_a_report_round_trips_every_counter_total() -> None:
    registry = new_registry()
    metrics = GlobalMetrics(registry)
    metrics.dns_responses.labels("api", "eu-west", "NOERROR").inc(3)
    metrics.dns_rebuilds.inc()
    samples = list(counter_samples(registry))
    assert (
        CounterSample(
            RESPONSES, (("kind", "api"), ("rcode", "NOERROR"), ("region", "eu-west")), 3.0
        )
        in samples
    )
    assert CounterSample("gtm_global_dns_answer_rebuilds_total", (), 1.0) in samples
    assert decode_report(encode_report(samples).encode()) == samples


def test_junk_lines_are_not_reports() -> None:
    for line in (b"", b"hello", b'{"ready": "127.0.0.1:53"}', b'{"counters": [[1]]}', b"[]"):
        assert decode_report(line) is None


def test_the_merger_adds_increments_and_starts_over_after_a_restart() -> None:
    metrics = GlobalMetrics(new_registry())
    merger = CounterMerger(global_counters(metrics))
    labels = (("kind", "api"), ("rcode", "NOERROR"), ("region", "eu-west"))
    merger.add(1, [CounterSample(RESPONSES, labels, 5.0)])
    merger.add(2, [CounterSample(RESPONSES, labels, 2.0)])
    merger.add(1, [CounterSample(RESPONSES, labels, 7.0)])  # +2 since the last report
    assert _value(metrics, "api", "eu-west", "NOERROR") == 9.0
    assert merger.reported(1, RESPONSES) == 7.0
    merger.forget(1)  # child 1 died; its replacement counts from zero
    merger.add(1, [CounterSample(RESPONSES, labels, 1.0)])
    assert _value(metrics, "api", "eu-west", "NOERROR") == 10.0
    assert merger.reported(2, RESPONSES) == 2.0


def test_the_merger_ignores_counters_the_parent_does_not_have() -> None:
    registry = new_registry()
    metrics = GlobalMetrics(registry)
    merger = CounterMerger(global_counters(metrics))
    merger.add(1, [CounterSample("gtm_something_else_total", (), 4.0)])
    merger.add(1, [CounterSample("gtm_global_dns_answer_rebuilds_total", (), 2.0)])
    assert metrics.dns_rebuilds._value.get() == 2.0
    assert all(isinstance(c, Counter) for c in global_counters(metrics))
    assert metrics.dns_responses in global_counters(metrics)
