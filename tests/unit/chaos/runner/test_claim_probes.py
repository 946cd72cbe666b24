"""The probes that check a scenario's claimed behaviour happened (issue 22: game days
that can fail): spills counted, refusals counted, a region's share of the traffic at the
moment of a fault, a fault the product refused."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from chaos.journal import FaultAction, FaultRecord, MetricRecord
from chaos.probes import (
    FaultRefused,
    MetricValue,
    RegionShare,
    SpillCount,
    StatusCount,
    Window,
)
from chaos.runner import parse_metrics
from tests.unit.chaos.runner.helpers import failed, journal, ok


def test_spill_count_needs_enough_spills_from_the_named_regions() -> None:
    j = journal()
    j.requests += [
        ok(11, "eu-west", spilled_from="eu-central"),
        ok(12, "eu-west", spilled_from="eu-central,us-east"),
        ok(13, "us-east", spilled_from="eu-west"),
        ok(14, "eu-central"),
        failed(15, 503),
    ]
    probe = SpillCount(window=Window.DURING, from_regions=("eu-central",), min=2)
    result = probe.measure(j)
    assert (result.value, result.passed, result.samples) == (2.0, True, 5)
    assert (
        not SpillCount(window=Window.DURING, from_regions=("eu-central",), min=3).measure(j).passed
    )
    # No spill at all — the overload scenario of issue 22 — fails.
    assert not SpillCount(window=Window.BEFORE, min=1).measure(j).passed


def test_spill_count_fails_on_a_spill_outside_the_allowed_regions() -> None:
    j = journal()
    j.requests += [ok(11, "eu-west", spilled_from="eu-central") for _ in range(3)]
    j.requests.append(ok(12, "us-east", spilled_from="eu-central"))
    allowed = SpillCount(window=Window.DURING, min=1, to_regions=("eu-west", "eu-central"))
    result = allowed.measure(j)
    assert result.value == 4.0
    assert not result.passed
    assert "1 landed outside eu-west,eu-central" in result.detail


def test_status_count_bounds_the_refusals_with_a_status() -> None:
    j = journal()
    j.requests += [failed(11, 451, stream="eu"), failed(12, 503, stream="eu"), ok(13)]
    j.requests += [failed(14, 429, stream="eu"), failed(15, 429)]
    closed = StatusCount(stream="eu", window=Window.DURING, statuses=(451, 503), min=2)
    assert (closed.measure(j).value, closed.measure(j).passed) == (2.0, True)
    assert not closed.model_copy(update={"min": 3}).measure(j).passed
    # No 429 for the tenant without a quota.
    none = StatusCount(stream="default", window=Window.ALL, statuses=(429,), max=0)
    assert (none.measure(j).value, none.measure(j).passed) == (1.0, False)
    # An empty window fails: a refusal that must happen cannot happen on nothing.
    assert not StatusCount(window=Window.BEFORE, statuses=(429,), max=0).measure(j).passed


def test_status_count_needs_a_bound() -> None:
    with pytest.raises(ValidationError, match="min ≥ 1 or a max"):
        StatusCount(statuses=(429,))
    with pytest.raises(ValidationError, match="below min"):
        StatusCount(statuses=(429,), min=3, max=1)


def test_region_share_before_a_step_sees_whether_the_region_carried_traffic() -> None:
    j = journal(fault_at=10)
    j.requests += [ok(5, "eu-west"), ok(7, "us-east"), ok(8, "eu-west"), ok(9.5, "us-east")]
    j.requests += [failed(9.9, 503), ok(11, "us-east")]
    probe = RegionShare(regions=("eu-west",), step="kill", span_s=4.0, min=0.5)
    result = probe.measure(j)
    # Sent in [6, 10): 7 us-east, 8 eu-west, 9.5 us-east (9.9 failed: not served).
    assert result.value == pytest.approx(1 / 3)
    assert (result.passed, result.samples) == (False, 3)
    # Traffic had already left the region before the kill: the share is 0.
    assert RegionShare(regions=("eu-west",), step="kill", span_s=1.0, min=0.1).measure(
        j
    ).value == pytest.approx(0.0)


def test_region_share_in_a_window_bounds_traffic_that_should_have_moved() -> None:
    j = journal()
    j.requests += [ok(11, "eu-west"), ok(13, "us-east"), ok(14, "us-east")]
    moved = RegionShare(regions=("eu-west",), window=Window.DURING, skip_s=2.5, max=0.0)
    # 11 is before detection (skipped); 13 and 14 went elsewhere.
    assert (moved.measure(j).value, moved.measure(j).passed) == (0.0, True)
    j.requests.append(ok(15, "eu-west"))
    after = moved.measure(j)
    assert after.value == pytest.approx(1 / 3)
    assert not after.passed


def test_region_share_step_never_injected_fails() -> None:
    j = journal()
    result = RegionShare(regions=("eu-west",), step="other", min=0.1).measure(j)
    assert (result.value, result.passed) == (None, False)
    assert "never injected" in result.detail


def test_region_share_needs_a_bound() -> None:
    with pytest.raises(ValidationError, match="min > 0 or max < 1"):
        RegionShare(regions=("eu-west",))


def test_fault_refused_passes_only_when_every_step_was_refused() -> None:
    j = journal()
    refused = FaultRecord(12, FaultAction.INJECT, "bad", "policy-push", "rejected", refused=True)
    accepted = FaultRecord(13, FaultAction.INJECT, "typo", "policy-push", "applied as gen 2")
    j.faults += [refused, accepted]
    assert FaultRefused(steps=("bad",)).measure(j).passed
    both = FaultRefused(steps=("bad", "typo")).measure(j)
    assert (both.value, both.passed, both.detail) == (1.0, False, "accepted: typo")
    j.faults[-1] = dataclasses.replace(accepted, refused=True)
    assert FaultRefused(steps=("bad", "typo")).measure(j).passed
    missing = FaultRefused(steps=("absent",)).measure(j)
    assert not missing.passed
    assert missing.detail == "never injected: absent"


def test_region_share_by_zone_or_gpu() -> None:
    j = journal(fault_at=10)
    j.requests += [
        dataclasses.replace(ok(7, "eu-central"), zone="eu-central-a", gpu="a-h100"),
        dataclasses.replace(ok(8, "eu-central"), zone="eu-central-b", gpu="b-a100"),
        dataclasses.replace(ok(12, "eu-central"), zone="eu-central-b", gpu="b-a100"),
    ]
    before = RegionShare(gpus=("a-h100",), step="kill", span_s=4.0, min=0.25).measure(j)
    assert (before.value, before.passed) == (0.5, True)
    after = RegionShare(zones=("eu-central-a",), window=Window.DURING, max=0.0).measure(j)
    assert (after.value, after.passed) == (0.0, True)
    with pytest.raises(ValidationError, match="exactly one of regions, zones, gpus"):
        RegionShare(regions=("eu-central",), zones=("eu-central-a",), max=0.5)


def test_metric_sums_the_matching_samples_of_a_source() -> None:
    j = journal()
    j.metrics += [
        MetricRecord(29, "global", "gtm_snapshot_relists_total", (("component", "global"),), 2.0),
        MetricRecord(29, "global", "gtm_snapshot_relists_total", (("component", "dns"),), 1.0),
        MetricRecord(29, "regional/eu-west", "gtm_snapshot_relists_total", (), 5.0),
    ]
    relisted = MetricValue(
        source="global", metric="gtm_snapshot_relists_total", labels={"component": "global"}, min=2
    )
    assert (relisted.measure(j).value, relisted.measure(j).passed) == (2.0, True)
    every = MetricValue(source="global", metric="gtm_snapshot_relists_total", max=2)
    assert (every.measure(j).value, every.measure(j).passed) == (3.0, False)
    missing = MetricValue(source="zone/eu-west-a", metric="gtm_snapshot_relists_total", min=1)
    assert (missing.measure(j).value, missing.measure(j).detail) == (None, "not scraped")
    with pytest.raises(ValidationError, match="min or max"):
        MetricValue(source="global", metric="x")
    with pytest.raises(ValidationError, match="source"):
        MetricValue(source="elsewhere", metric="x", min=1)


def test_parse_metrics_reads_a_prometheus_exposition() -> None:
    text = (
        "# HELP gtm_snapshot_relists_total Full re-lists.\n"
        "# TYPE gtm_snapshot_relists_total counter\n"
        'gtm_snapshot_relists_total{component="global"} 2.0\n'
        "# TYPE up gauge\n"
        "up 1\n"
    )
    samples = parse_metrics(text)
    assert ("gtm_snapshot_relists_total", (("component", "global"),), 2.0) in samples
    assert ("up", (), 1.0) in samples
