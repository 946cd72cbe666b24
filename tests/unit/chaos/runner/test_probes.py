"""The probe arithmetic on synthetic journals (times are exact: no clock involved)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from chaos.journal import FaultAction, FaultRecord, Journal, RequestRecord
from chaos.probes import (
    CutStreams,
    DnsAnswers,
    FailoverTime,
    Oscillation,
    RefusalCodes,
    RequestsLost,
    ResidencyViolations,
    RetryRatio,
    SpillShare,
    SuccessRate,
    TtftP99,
    Window,
    count_changes,
    request_counts,
    window_bounds,
)
from tests.unit.chaos.runner.helpers import answer, failed, journal, ok


def test_windows_follow_the_phases_and_skip() -> None:
    j = journal(fault_at=10, rollback_at=20, end=30)
    assert window_bounds(j, Window.BEFORE, 0) == (0, 10)
    assert window_bounds(j, Window.DURING, 2.5) == (12.5, 20)
    assert window_bounds(j, Window.AFTER, 0) == (20, 30)
    assert window_bounds(j, Window.ALL, 0) == (0, 30)


def test_injections_are_the_steps_injected_without_error() -> None:
    j = journal()  # "kill" injected at 10 s, rolled back at 20 s
    failed_push = FaultRecord(12.0, FaultAction.INJECT, "push", "policy-push", "p", error="no")
    j.faults.append(failed_push)
    assert [f.step for f in j.injections()] == ["kill"]
    assert j.injections(("kill",))[0].at == 10.0
    assert j.injections(("push",)) == []
    assert j.fault_windows() == [("kill", "kill -9 regional/eu-west", 10.0, 20.0)]


def test_a_window_never_reached_fails_with_no_value() -> None:
    j = Journal(t0_wall=0.0)
    result = SuccessRate(min=0.5, window=Window.AFTER).measure(j)
    assert (result.value, result.passed, result.samples) == (None, False, 0)
    assert "never reached after" in result.detail


def test_success_rate_counts_requests_by_the_window_they_were_sent_in() -> None:
    j = journal()
    j.requests += [ok(1), ok(2), failed(3), ok(11), failed(12), failed(13), ok(21)]
    before = SuccessRate(min=0.6, window=Window.BEFORE).measure(j)
    during = SuccessRate(min=0.5, window=Window.DURING).measure(j)
    after = SuccessRate(min=1.0, window=Window.AFTER).measure(j)
    assert before.value == pytest.approx(2 / 3)
    assert before.passed
    assert during.value == pytest.approx(1 / 3)
    assert not during.passed
    assert after.value == 1.0
    assert after.passed
    assert during.detail == "1/3 succeeded"


def test_success_rate_first_attempt_ignores_retried_successes() -> None:
    j = journal()
    j.requests += [ok(1), ok(2, attempts=2), ok(3, attempts=3), ok(4)]
    assert SuccessRate(min=0.0).measure(j).value == 1.0
    assert SuccessRate(min=0.0, first_attempt=True).measure(j).value == 0.5


def test_success_rate_on_no_requests_fails() -> None:
    result = SuccessRate(min=0.0).measure(journal())
    assert not result.passed
    assert result.value is None


def test_stream_filter() -> None:
    j = journal()
    j.requests += [ok(1, stream="eu"), failed(2, stream="default")]
    assert SuccessRate(min=1.0, stream="eu").measure(j).passed
    assert not SuccessRate(min=1.0).measure(j).passed


def test_ttft_p99_nearest_rank_in_ms() -> None:
    j = journal()
    j.requests += [ok(float(i) / 10, ttft=(i + 1) / 1000) for i in range(100)]  # 1..100 ms
    result = TtftP99(max_ms=99.0, window=Window.BEFORE).measure(j)
    assert result.value == pytest.approx(99.0)
    assert result.passed
    assert result.samples == 100
    assert not TtftP99(max_ms=98.9, window=Window.BEFORE).measure(j).passed


def test_failover_time_is_the_last_request_or_answer_to_the_dead_target() -> None:
    j = journal(fault_at=10, rollback_at=20)
    j.requests += [
        ok(9.0, "eu-west"),  # before the fault: ignored
        ok(10.4, "eu-west"),  # routed before detection
        ok(11.2, "us-east", attempts=2),  # its first attempt hit the dead region
        ok(12.0, "us-east"),
        ok(21.0, "eu-west"),  # after rollback: ignored
    ]
    j.dns += [answer(10.2, "eu-west", "us-east"), answer(11.6, "eu-west"), answer(12.0, "us-east")]
    result = FailoverTime(step="kill", max_s=2.0).measure(j)
    assert result.value == pytest.approx(1.6)  # the DNS answer at 11.6
    assert result.passed
    assert "DNS" in result.detail
    assert not FailoverTime(step="kill", max_s=1.5).measure(j).passed


def test_failover_time_counts_failed_requests_and_is_zero_when_nothing_went_there() -> None:
    j = journal(fault_at=10, rollback_at=20)
    j.requests += [ok(10.5, "us-east"), ok(11.0, "us-east")]
    assert FailoverTime(step="kill", max_s=1.0).measure(j).value == 0.0
    j.requests.append(failed(13.25, 502, "http-502"))
    result = FailoverTime(step="kill", max_s=1.0).measure(j)
    assert result.value == pytest.approx(3.25)
    assert not result.passed
    assert "failed (502 http-502)" in result.detail


def test_failover_time_dns_names_and_explicit_targets() -> None:
    j = journal(fault_at=10, rollback_at=20)
    j.requests.append(ok(10.5))
    j.dns += [answer(15.0, "eu-west", name="eu-west.api.inference.example.")]
    watched = FailoverTime(step="kill", max_s=1.0, dns_names=("api.inference.example",))
    assert watched.measure(j).value == 0.0
    assert FailoverTime(step="kill", max_s=1.0).measure(j).value == pytest.approx(5.0)
    other = FailoverTime(step="kill", max_s=1.0, targets=("us-east",))
    assert other.measure(j).value == pytest.approx(0.5)


def test_failover_time_of_a_step_never_injected_fails() -> None:
    result = FailoverTime(step="nope", max_s=1.0).measure(journal())
    assert not result.passed
    assert "never injected" in result.detail


def test_residency_violations_count_requests_and_dns_answers_outside() -> None:
    j = journal()
    j.requests += [
        ok(1, "eu-west", stream="eu"),
        ok(2, "us-east", stream="eu"),
        ok(3, "us-east", stream="default"),
        failed(4, 451, stream="eu"),
    ]
    j.dns += [answer(1, "eu-west", name="eu.api.x."), answer(2, "us-east", name="eu.api.x.")]
    probe = ResidencyViolations(
        stream="eu", allowed_regions=("eu-west", "eu-central"), dns_names=("eu.api.x",)
    )
    result = probe.measure(j)
    assert result.value == 2
    assert not result.passed
    assert result.detail.startswith("1 requests, 1 DNS answers")
    j.requests.pop(1)
    j.dns.pop()
    assert probe.measure(j).passed


def test_refusal_codes_only_allowed_statuses() -> None:
    j = journal()
    j.requests += [failed(11, 451, stream="eu"), failed(12, 503, stream="eu"), ok(13, stream="eu")]
    probe = RefusalCodes(stream="eu", window=Window.DURING, allowed_statuses=(451, 503))
    assert probe.measure(j).value == 0
    assert probe.measure(j).passed
    j.requests.append(failed(14, 0, "TimeoutError", stream="eu"))
    result = probe.measure(j)
    assert result.value == 1
    assert not result.passed
    assert "0:TimeoutError" in result.detail


def test_refusal_codes_leave_out_only_streams_a_kill_cut_where_they_were_served() -> None:
    # The helper's journal kills regional/eu-west (step "kill") at 10 s.
    def cut(sent: float, done: float, region: str, zone: str = "") -> RequestRecord:
        return RequestRecord(
            sent, done, False, 200, "stream-error:upstream_reset", 0.1, region, "", 1, "eu",
            zone=zone,
        )  # fmt: skip

    j = journal()
    j.requests += [cut(9.0, 10.5, "eu-west")]  # under way on eu-west at the kill
    probe = RefusalCodes(stream="eu", allowed_statuses=(429,), cut_by=("kill",))
    result = probe.measure(j)
    assert (result.value, result.passed) == (0, True)
    assert result.detail == "1 failed, all with allowed statuses; 1 stream(s) cut by kill left out"
    # Without cut_by, the same stream counts.
    assert RefusalCodes(stream="eu", allowed_statuses=(429,)).measure(j).value == 1
    # Served elsewhere, sent after the kill, or broken before it: each counts.
    for other in (
        cut(9.0, 10.5, "eu-central"),
        cut(10.2, 11.0, "eu-west"),
        cut(8.0, 9.5, "eu-west"),
    ):
        j.requests[:] = [other]
        assert probe.measure(j).value == 1, other
    # A zone or a GPU taken away counts as its target too; a refusal is never left out.
    j.faults[0] = replace(j.faults[0], targets=("eu-west-a",))
    j.requests[:] = [cut(9.0, 10.5, "eu-west", zone="eu-west-a"), failed(9.0, 502, stream="eu")]
    assert probe.measure(j).value == 1
    assert "502:ClientConnectorError" in probe.measure(j).detail


def test_requests_lost_and_retry_ratio() -> None:
    j = journal()
    j.requests += [ok(11), ok(12, attempts=2), ok(13, attempts=3), failed(14, attempts=3)]
    lost = RequestsLost(max=0, window=Window.DURING).measure(j)
    assert lost.value == 1
    assert not lost.passed
    ratio = RetryRatio(max=1.0, window=Window.DURING).measure(j)
    assert ratio.value == pytest.approx((0 + 1 + 2 + 2) / 4)
    assert not ratio.passed
    assert request_counts(j) == (4, 1, 3)


def test_spill_share_by_origin() -> None:
    j = journal()
    j.requests += [ok(1), ok(2, spilled_from="eu-west"), ok(3, spilled_from="us-east,eu-west")]
    assert SpillShare(max=1.0).measure(j).value == pytest.approx(2 / 3)
    only_eu = SpillShare(max=0.34, from_regions=("eu-west",)).measure(j)
    assert only_eu.value == pytest.approx(1 / 3)
    assert only_eu.passed


def test_dns_answers_exclusion_requirement_and_empty_answers() -> None:
    j = journal()
    j.dns += [answer(11, "eu-central"), answer(12), answer(13, "eu-west", "eu-central")]
    assert (
        DnsAnswers(dns_name="api.inference.example.", exclude_regions=("eu-west",)).measure(j).value
        == 1
    )
    strict = DnsAnswers(
        dns_name="api.inference.example", allow_empty=False, exclude_regions=("eu-west",)
    )
    assert strict.measure(j).value == 2
    required = DnsAnswers(dns_name="api.inference.example.", require_regions=("eu-central",))
    assert required.measure(j).value == 1  # the empty answer lacks it


def test_oscillation_counts_changes_of_presence() -> None:
    assert count_changes([]) == 0
    assert count_changes([True, True, False, False, True]) == 2
    j = journal(fault_at=10, rollback_at=20, end=40)
    j.dns += [
        answer(t, "eu-west") if on else answer(t, "us-east")
        for t, on in [(21, False), (22, True), (23, True), (24, False), (25, True), (26, True)]
    ]
    probe = Oscillation(
        dns_name="api.inference.example.", region="eu-west", window=Window.AFTER, max=1
    )
    result = probe.measure(j)
    assert result.value == 3
    assert not result.passed
    settled = Oscillation(
        dns_name="api.inference.example.", region="eu-west", window=Window.AFTER, skip_s=4.5, max=0
    )
    assert settled.measure(j).value == 0


def test_a_run_that_never_ended_has_an_open_last_window() -> None:
    j = journal()
    j.ended_at = None
    j.phases.pop()
    assert window_bounds(j, Window.AFTER, 0) == (20.0, math.inf)


def test_failover_time_counts_slow_requests_when_asked() -> None:
    j = journal(fault_at=10, rollback_at=20)
    j.requests += [ok(10.5, ttft=0.2), ok(12.0, ttft=8.0), ok(13.0, ttft=0.3)]
    assert FailoverTime(step="kill", max_s=1.0).measure(j).value == 0.0
    slow = FailoverTime(step="kill", max_s=1.0, slow_ms=5000).measure(j)
    assert slow.value == pytest.approx(2.0)
    assert "TTFT 8000 ms" in slow.detail


def test_ignored_statuses_and_refusals_are_not_the_dead_target() -> None:
    j = journal(fault_at=10, rollback_at=20)
    j.requests += [ok(11), failed(12, 429, "http-429:rate_limit_exceeded", attempts=1), ok(13)]
    assert RequestsLost(max=0, window=Window.DURING).measure(j).value == 1
    assert RequestsLost(max=0, window=Window.DURING, ignore_statuses=(429,)).measure(j).passed
    rate = SuccessRate(min=1.0, window=Window.DURING, ignore_statuses=(429,)).measure(j)
    assert rate.value == 1.0
    assert rate.samples == 2
    assert FailoverTime(step="kill", max_s=1.0).measure(j).value == 0.0


def test_cut_streams_count_the_streams_that_broke_after_their_first_byte() -> None:
    j = journal()
    j.requests += [
        ok(1),
        failed(2, 200, "stream-error:upstream_reset", attempts=1),
        failed(3, 200, "cut-stream:ClientPayloadError", attempts=1),
        failed(4, 200, "truncated-stream", attempts=1),
        failed(5, 502, "http-502"),
        failed(11, 200, "stream-error:upstream_timeout", attempts=1),
    ]
    before = CutStreams(max=0, window=Window.BEFORE).measure(j)
    assert before.value == 3
    assert not before.passed
    assert before.detail == (
        "3/5 requests (cut-stream:ClientPayloadError, stream-error:upstream_reset, "
        "truncated-stream)"
    )
    assert CutStreams(min=1, max=1, window=Window.DURING).measure(j).passed
    nothing = CutStreams(max=0, window=Window.AFTER).measure(j)
    assert (nothing.value, nothing.passed, nothing.samples) == (0, False, 0)  # measured nothing


def test_cut_streams_needs_a_bound() -> None:
    with pytest.raises(ValueError, match="needs min"):
        CutStreams()
    with pytest.raises(ValueError, match="below min"):
        CutStreams(min=2, max=1)
