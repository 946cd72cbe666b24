"""The steady-state probes: typed criteria with tolerances, and their arithmetic over a
:class:`~chaos.journal.Journal`.

Each probe is a frozen model (a member of the :data:`Probe` union, discriminated on
``probe``) with a pure ``measure(journal) -> Measurement``. The runner calls them on the
journal as it stands at the end of a phase; tests call them on synthetic journals.

Windows: a probe looks at one phase (``before`` the first fault, ``during`` the faults,
``after`` the last rollback, or ``all``), optionally skipping its first ``skip_s``
seconds — the detection time a criterion allows (e.g. "TTFT p99 back in SLO ≤ 2H").
A request belongs to the window it was *sent* in.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, model_validator

from chaos.journal import DnsRecord, FaultAction, Journal, MetricRecord, Phase, RequestRecord
from gtm.models import Frozen, Identifier
from gtm.stats import percentile
from gtmctl.load import is_stream_break


class Window(StrEnum):
    BEFORE = "before"
    DURING = "during"
    AFTER = "after"
    ALL = "all"


@dataclass(frozen=True, slots=True)
class Measurement:
    """A probe's result: the measured value, the tolerance as text, pass or fail, and
    how many samples it is based on (a criterion measured on nothing fails)."""

    name: str
    value: float | None
    tolerance: str
    passed: bool
    samples: int
    detail: str = ""

    def value_text(self) -> str:
        if self.value is None:
            return "–"
        if float(self.value).is_integer():
            return f"{int(self.value)}"
        return f"{self.value:.4g}"


def window_bounds(journal: Journal, window: Window, skip_s: float) -> tuple[float, float] | None:
    """[start, end) of a window; None when the run never reached it."""
    if window is Window.ALL:
        start = journal.phase_start(Phase.BEFORE)
        if start is None:
            return None
        end = journal.ended_at if journal.ended_at is not None else math.inf
        return start + skip_s, end
    bounds = journal.phase_window(Phase(window.value))
    if bounds is None:
        return None
    return bounds[0] + skip_s, bounds[1]


def requests_in(
    journal: Journal, window: Window, skip_s: float, stream: str | None
) -> list[RequestRecord] | None:
    bounds = window_bounds(journal, window, skip_s)
    if bounds is None:
        return None
    start, end = bounds
    return [
        r
        for r in journal.requests
        if start <= r.sent_at < end and (stream is None or r.stream == stream)
    ]


def dns_in(journal: Journal, window: Window, skip_s: float, name: str) -> list[DnsRecord] | None:
    bounds = window_bounds(journal, window, skip_s)
    if bounds is None:
        return None
    start, end = bounds
    wanted = _fqdn(name)
    return [d for d in journal.dns if start <= d.at < end and _fqdn(d.name) == wanted]


def _fqdn(name: str) -> str:
    return name.lower().rstrip(".") + "."


def _not_reached(name: str, tolerance: str, window: Window) -> Measurement:
    return Measurement(name, None, tolerance, False, 0, f"the run never reached {window.value}")


def _counted(
    found: list[RequestRecord] | None, ignore_statuses: tuple[int, ...]
) -> list[RequestRecord] | None:
    if found is None or not ignore_statuses:
        return found
    return [r for r in found if r.ok or r.status not in ignore_statuses]


def dead_target_failure(record: RequestRecord) -> bool:
    """A failure that can come from a dead target: no HTTP answer or a 5xx. A 4xx is a
    live tier refusing (quota, residency), not traffic to the dead one."""
    return not record.ok and (record.status == 0 or record.status >= 500)


class _Probe(Frozen):
    #: Shown in the report; defaults to a description of the probe.
    name: str = ""
    window: Window = Window.ALL
    skip_s: float = Field(default=0.0, ge=0.0)
    #: Only requests of this load stream (None: all).
    stream: str | None = None

    def label(self, default: str) -> str:
        where = f"{self.window.value}" + (f"+{self.skip_s:g}s" if self.skip_s else "")
        scope = f", stream {self.stream}" if self.stream else ""
        return self.name or f"{default} ({where}{scope})"


class SuccessRate(_Probe):
    """Share of requests that succeeded (after the client's retries, or on the first
    attempt with ``first_attempt``)."""

    probe: Literal["success_rate"] = "success_rate"
    min: float = Field(ge=0.0, le=1.0)
    first_attempt: bool = False
    #: Failures with these statuses are left out (neither success nor failure): e.g.
    #: 429, a tenant's own quota working as documented, where the criterion is about
    #: availability. Each scenario that uses it says why.
    ignore_statuses: tuple[int, ...] = ()

    def measure(self, journal: Journal) -> Measurement:
        label = self.label("success rate" + (" (first attempt)" if self.first_attempt else ""))
        tolerance = f"≥ {100 * self.min:g} %"
        found = _counted(
            requests_in(journal, self.window, self.skip_s, self.stream), self.ignore_statuses
        )
        if found is None:
            return _not_reached(label, tolerance, self.window)
        if not found:
            return Measurement(label, None, tolerance, False, 0, "no requests in the window")
        ok = sum(1 for r in found if r.ok and (r.attempts == 1 or not self.first_attempt))
        rate = ok / len(found)
        return Measurement(
            label, rate, tolerance, rate >= self.min, len(found), f"{ok}/{len(found)} succeeded"
        )


class TtftP99(_Probe):
    """p99 time to first token of the successful requests, ms."""

    probe: Literal["ttft_p99"] = "ttft_p99"
    max_ms: float = Field(gt=0.0)

    def measure(self, journal: Journal) -> Measurement:
        label = self.label("TTFT p99 ms")
        tolerance = f"≤ {self.max_ms:g} ms"
        found = requests_in(journal, self.window, self.skip_s, self.stream)
        if found is None:
            return _not_reached(label, tolerance, self.window)
        ttfts = [r.ttft_s for r in found if r.ok and r.ttft_s is not None]
        if not ttfts:
            return Measurement(label, None, tolerance, False, 0, "no successful requests")
        value = 1000.0 * percentile(ttfts, 0.99)
        return Measurement(label, value, tolerance, value <= self.max_ms, len(ttfts))


class ResidencyViolations(_Probe):
    """Requests of a residency-bound stream served outside its allowed regions, plus
    DNS answers for its jurisdiction's names that point outside them. Must be 0."""

    probe: Literal["residency_violations"] = "residency_violations"
    stream: str | None = Field(min_length=1)
    allowed_regions: tuple[Identifier, ...] = Field(min_length=1)
    #: Residency-bound DNS names (``eu.api.<zone>``) whose answers are audited too.
    dns_names: tuple[str, ...] = ()
    max: int = Field(default=0, ge=0)

    def measure(self, journal: Journal) -> Measurement:
        label = self.label("residency violations")
        tolerance = f"≤ {self.max}"
        found = requests_in(journal, self.window, self.skip_s, self.stream)
        if found is None:
            return _not_reached(label, tolerance, self.window)
        allowed = set(self.allowed_regions)
        bad_requests = [r for r in found if r.ok and r.region and r.region not in allowed]
        bad_dns: list[DnsRecord] = []
        answers = 0
        for name in self.dns_names:
            records = dns_in(journal, self.window, self.skip_s, name) or []
            answers += len(records)
            bad_dns += [d for d in records if any(g not in allowed for g in d.regions)]
        count = len(bad_requests) + len(bad_dns)
        samples = len(found) + answers
        detail = f"{len(bad_requests)} requests, {len(bad_dns)} DNS answers outside " + ",".join(
            self.allowed_regions
        )
        return Measurement(
            label, float(count), tolerance, count <= self.max and samples > 0, samples, detail
        )


class RefusalCodes(_Probe):
    """Failed requests of a stream must fail with one of these statuses (fail closed:
    451 residency refusal, 503 no capacity in-jurisdiction) — never hang, never 5xx
    from a crash. Measured: failures with any other status."""

    probe: Literal["refusal_codes"] = "refusal_codes"
    allowed_statuses: tuple[int, ...] = Field(min_length=1)
    max: int = Field(default=0, ge=0)
    #: Method steps that kill what serves streams (``kill`` of a regional LB or a zone):
    #: a stream that was under way on one of the step's targets (region, zone or GPU)
    #: when the step was injected, and broke after its first byte, broke because of the
    #: kill — a started stream cannot be retried without billing twice — and is no
    #: refusal: it is left out (the detail counts it). Any other broken stream counts.
    cut_by: tuple[str, ...] = ()

    def measure(self, journal: Journal) -> Measurement:
        label = self.label("failures with other statuses")
        tolerance = f"≤ {self.max} (allowed {', '.join(map(str, self.allowed_statuses))})"
        found = requests_in(journal, self.window, self.skip_s, self.stream)
        if found is None:
            return _not_reached(label, tolerance, self.window)
        failed = [r for r in found if not r.ok]
        kills = _kills(journal, self.cut_by)
        killed = bad = 0
        reasons: set[str] = set()
        for r in failed:
            if _cut_by_kill(r, kills):
                killed += 1
            elif r.status not in self.allowed_statuses:
                bad += 1
                reasons.add(f"{r.status}:{r.reason}")
        detail = (
            f"{len(failed)} failed; other: {', '.join(sorted(reasons)[:5])}"
            if bad
            else f"{len(failed)} failed, all with allowed statuses"
        )
        if killed:
            detail += f"; {killed} stream(s) cut by {', '.join(self.cut_by)} left out"
        return Measurement(label, float(bad), tolerance, bad <= self.max, len(found), detail)


def _kills(journal: Journal, steps: Collection[str]) -> list[tuple[float, frozenset[str]]]:
    """When each of ``steps`` was injected, and what it took away."""
    return [(f.at, frozenset(f.targets)) for f in journal.injections(steps)]


def _cut_by_kill(record: RequestRecord, kills: Sequence[tuple[float, frozenset[str]]]) -> bool:
    """Whether ``record`` is a stream that broke after its first byte, was under way
    when one of ``kills`` was injected, and was served by what that kill took away."""
    if not is_stream_break(record.reason):
        return False
    served = {record.region, record.zone, record.gpu} - {""}
    return any(
        record.sent_at < at <= record.done_at and not served.isdisjoint(targets)
        for at, targets in kills
    )


class RequestsLost(_Probe):
    """Requests that failed after every client attempt."""

    probe: Literal["requests_lost"] = "requests_lost"
    max: int = Field(ge=0)
    #: As :attr:`SuccessRate.ignore_statuses`.
    ignore_statuses: tuple[int, ...] = ()

    def measure(self, journal: Journal) -> Measurement:
        label = self.label("requests lost")
        tolerance = f"≤ {self.max}"
        found = _counted(
            requests_in(journal, self.window, self.skip_s, self.stream), self.ignore_statuses
        )
        if found is None:
            return _not_reached(label, tolerance, self.window)
        lost = [r for r in found if not r.ok]
        reasons = sorted({r.reason or str(r.status) for r in lost})
        return Measurement(
            label,
            float(len(lost)),
            tolerance,
            len(lost) <= self.max and bool(found),
            len(found),
            ", ".join(reasons[:5]),
        )


class RetryRatio(_Probe):
    """Extra attempts per request (Google SRE: per-client retries < 10 %)."""

    probe: Literal["retry_ratio"] = "retry_ratio"
    max: float = Field(ge=0.0)

    def measure(self, journal: Journal) -> Measurement:
        label = self.label("retry ratio")
        tolerance = f"≤ {self.max:g}"
        found = requests_in(journal, self.window, self.skip_s, self.stream)
        if found is None:
            return _not_reached(label, tolerance, self.window)
        if not found:
            return Measurement(label, None, tolerance, False, 0, "no requests in the window")
        extra = sum(r.attempts - 1 for r in found)
        ratio = extra / len(found)
        return Measurement(
            label,
            ratio,
            tolerance,
            ratio <= self.max,
            len(found),
            f"{extra} retries for {len(found)} requests",
        )


class SpillShare(_Probe):
    """Share of successful requests a regional LB spilled to another region."""

    probe: Literal["spill_share"] = "spill_share"
    max: float = Field(ge=0.0, le=1.0)
    #: Only spills out of these regions count (empty: all).
    from_regions: tuple[Identifier, ...] = ()

    def measure(self, journal: Journal) -> Measurement:
        label = self.label("spill share")
        tolerance = f"≤ {100 * self.max:g} %"
        found = requests_in(journal, self.window, self.skip_s, self.stream)
        if found is None:
            return _not_reached(label, tolerance, self.window)
        ok = [r for r in found if r.ok]
        if not ok:
            return Measurement(label, None, tolerance, False, 0, "no successful requests")
        spilled = [r for r in ok if r.spilled_from and self._counts(r.spilled_from)]
        share = len(spilled) / len(ok)
        return Measurement(
            label, share, tolerance, share <= self.max, len(ok), f"{len(spilled)}/{len(ok)} spilled"
        )

    def _counts(self, spilled_from: str) -> bool:
        origin = spilled_from.split(",")[0]
        return not self.from_regions or origin in self.from_regions


class SpillCount(_Probe):
    """How many successful requests a regional LB spilled to a peer: at least ``min``
    (the overload scenario's spillover must happen), and none to a region outside
    ``to_regions`` when given (a spill stays within the requests' allowed set)."""

    probe: Literal["spill_count"] = "spill_count"
    min: int = Field(ge=1)
    #: Only spills out of these regions count (empty: all).
    from_regions: tuple[Identifier, ...] = ()
    #: Regions a counted spill may land in (empty: any); a spill elsewhere fails.
    to_regions: tuple[Identifier, ...] = ()

    def measure(self, journal: Journal) -> Measurement:
        label = self.label("spilled requests")
        where = f", only to {','.join(self.to_regions)}" if self.to_regions else ""
        tolerance = f"≥ {self.min}{where}"
        found = requests_in(journal, self.window, self.skip_s, self.stream)
        if found is None:
            return _not_reached(label, tolerance, self.window)
        spilled = [
            r
            for r in found
            if r.ok
            and r.spilled_from
            and (not self.from_regions or r.spilled_from.split(",")[0] in self.from_regions)
        ]
        outside = [r for r in spilled if self.to_regions and r.region not in self.to_regions]
        detail = f"{len(spilled)} spilled of {len(found)}" + (
            f"; {len(outside)} landed outside {','.join(self.to_regions)}" if outside else ""
        )
        passed = len(spilled) >= self.min and not outside
        return Measurement(label, float(len(spilled)), tolerance, passed, len(found), detail)


class _CountProbe(_Probe):
    """A count of a window's requests that must lie between ``min`` and ``max``."""

    min: int = Field(default=0, ge=0)
    max: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _bounds(self) -> _CountProbe:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max}) is below min ({self.min})")
        if self.min == 0 and self.max is None:
            name = getattr(self, "probe", type(self).__name__)
            raise ValueError(f"{name} needs min ≥ 1 or a max")
        return self

    def tolerance(self) -> str:
        parts = [f"≥ {self.min}"] if self.min else []
        parts += [f"≤ {self.max}"] if self.max is not None else []
        return " and ".join(parts)

    def within(self, count: int) -> bool:
        return count >= self.min and (self.max is None or count <= self.max)


class StatusCount(_CountProbe):
    """How many requests of a window ended with one of ``statuses`` (after the client's
    retries), between ``min`` and ``max``: a refusal that must happen (residency fail
    closed: 451/503; an over-quota tenant: 429) or must not (429 for a tenant without
    a quota)."""

    probe: Literal["status_count"] = "status_count"
    statuses: tuple[int, ...] = Field(min_length=1)

    def measure(self, journal: Journal) -> Measurement:
        codes = ",".join(map(str, self.statuses))
        label = self.label(f"requests answered {codes}")
        tolerance = self.tolerance()
        found = requests_in(journal, self.window, self.skip_s, self.stream)
        if found is None:
            return _not_reached(label, tolerance, self.window)
        count = sum(1 for r in found if not r.ok and r.status in self.statuses)
        passed = self.within(count) and bool(found)
        return Measurement(
            label, float(count), tolerance, passed, len(found), f"{count}/{len(found)} requests"
        )


class CutStreams(_CountProbe):
    """How many requests of a window failed as a stream that broke after its first byte
    (an error event instead of ``[DONE]``, a connection cut mid-body, or no ``[DONE]``:
    :class:`gtmctl.load.StreamBreak`), between ``min`` and ``max``: a started stream
    cannot be retried, so a GPU that dies mid-stream must cut (and tell) exactly the
    streams it carried, and no other fault may cut any."""

    probe: Literal["cut_streams"] = "cut_streams"

    def measure(self, journal: Journal) -> Measurement:
        label = self.label("cut streams")
        tolerance = self.tolerance()
        found = requests_in(journal, self.window, self.skip_s, self.stream)
        if found is None:
            return _not_reached(label, tolerance, self.window)
        cut = [r for r in found if not r.ok and is_stream_break(r.reason)]
        count = len(cut)
        passed = self.within(count) and bool(found)
        reasons = ", ".join(sorted({r.reason for r in cut})[:5])
        detail = f"{count}/{len(found)} requests" + (f" ({reasons})" if reasons else "")
        return Measurement(label, float(count), tolerance, passed, len(found), detail)


class RegionShare(_Probe):
    """Share of the successful requests served by ``regions`` (or ``zones``, or
    ``gpus``: exactly one of them), within [``min``, ``max``]. With ``step`` the window
    is the ``span_s`` seconds right before that step's injection (by send time): what
    a fault breaks must carry traffic at the moment it is broken, or a failover
    criterion measures nothing."""

    probe: Literal["region_share"] = "region_share"
    regions: tuple[Identifier, ...] = ()
    zones: tuple[Identifier, ...] = ()
    gpus: tuple[str, ...] = ()
    min: float = Field(default=0.0, ge=0.0, le=1.0)
    max: float = Field(default=1.0, ge=0.0, le=1.0)
    #: Measure in the ``span_s`` seconds before this step's injection instead of ``window``.
    step: str | None = Field(default=None, min_length=1)
    span_s: float = Field(default=3.0, gt=0.0)

    @model_validator(mode="after")
    def _bounds(self) -> RegionShare:
        if sum(1 for t in (self.regions, self.zones, self.gpus) if t) != 1:
            raise ValueError("region_share needs exactly one of regions, zones, gpus")
        if self.max < self.min:
            raise ValueError(f"max ({self.max:g}) is below min ({self.min:g})")
        if self.min == 0.0 and self.max == 1.0:
            raise ValueError("region_share needs min > 0 or max < 1")
        return self

    def _served_by(self, record: RequestRecord) -> bool:
        if self.regions:
            return record.region in self.regions
        if self.zones:
            return record.zone in self.zones
        return record.gpu in self.gpus

    def measure(self, journal: Journal) -> Measurement:
        names = ",".join(self.regions or self.zones or self.gpus)
        tolerance = " and ".join(
            ([f"≥ {100 * self.min:g} %"] if self.min > 0 else [])
            + ([f"≤ {100 * self.max:g} %"] if self.max < 1 else [])
        )
        if self.step is not None:
            label = (
                self.name or f"share served by {names} in the {self.span_s:g} s before {self.step}"
            )
            inject = _injection(journal, self.step)
            if inject is None:
                return Measurement(
                    label, None, tolerance, False, 0, f"step {self.step} never injected"
                )
            start = inject - self.span_s
            found = [
                r
                for r in journal.requests
                if start <= r.sent_at < inject and (self.stream is None or r.stream == self.stream)
            ]
        else:
            label = self.label(f"share served by {names}")
            in_window = requests_in(journal, self.window, self.skip_s, self.stream)
            if in_window is None:
                return _not_reached(label, tolerance, self.window)
            found = in_window
        ok = [r for r in found if r.ok]
        if not ok:
            return Measurement(label, None, tolerance, False, 0, "no successful requests")
        inside = sum(1 for r in ok if self._served_by(r))
        share = inside / len(ok)
        passed = self.min <= share <= self.max
        return Measurement(
            label, share, tolerance, passed, len(ok), f"{inside}/{len(ok)} served by {names}"
        )


class FaultRefused(_Probe):
    """The injections of ``steps`` were refused by the product (a bad policy push
    rejected before anything was written). Measured: steps that went through."""

    probe: Literal["fault_refused"] = "fault_refused"
    steps: tuple[str, ...] = Field(min_length=1)

    def measure(self, journal: Journal) -> Measurement:
        label = self.name or f"pushes refused ({', '.join(self.steps)})"
        tolerance = "0 accepted"
        injects = {f.step: f for f in journal.injections(self.steps)}
        missing = [s for s in self.steps if s not in injects]
        accepted = [s for s, f in injects.items() if not f.refused]
        detail = (
            f"never injected: {', '.join(missing)}"
            if missing
            else (f"accepted: {', '.join(accepted)}" if accepted else "every push refused")
        )
        passed = not missing and not accepted
        return Measurement(label, float(len(accepted)), tolerance, passed, len(injects), detail)


class MetricValue(_Probe):
    """A tier's own counter or gauge at the end of the run, within [``min``, ``max``]:
    the sum of the samples of ``metric`` at ``source`` whose labels include ``labels``.
    For a behaviour the tiers' answers cannot show from outside (the global tier
    re-listed after a compacted watch: DNS shows a drain through the health checks
    whether it did or not). The window fields do not apply: it is read once, last."""

    probe: Literal["metric"] = "metric"
    #: ``global``, ``regional/<region>`` or ``zone/<zone>``.
    source: str = Field(pattern=r"^(global|(regional|zone)/[A-Za-z0-9][A-Za-z0-9._-]*)$")
    metric: str = Field(pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
    labels: dict[str, str] = Field(default_factory=dict)
    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _bounds(self) -> MetricValue:
        if self.min is None and self.max is None:
            raise ValueError("metric needs min or max")
        if self.min is not None and self.max is not None and self.max < self.min:
            raise ValueError(f"max ({self.max:g}) is below min ({self.min:g})")
        return self

    def matches(self, record: MetricRecord) -> bool:
        return (
            record.source == self.source
            and record.name == self.metric
            and set(self.labels.items()) <= set(record.labels)
        )

    def measure(self, journal: Journal) -> Measurement:
        shown = ",".join(f'{k}="{v}"' for k, v in sorted(self.labels.items()))
        label = self.name or f"{self.source} {self.metric}" + (f"{{{shown}}}" if shown else "")
        tolerance = " and ".join(
            ([f"≥ {self.min:g}"] if self.min is not None else [])
            + ([f"≤ {self.max:g}"] if self.max is not None else [])
        )
        found = [r for r in journal.metrics if self.matches(r)]
        if not found:
            return Measurement(label, None, tolerance, False, 0, "not scraped")
        value = sum(r.value for r in found)
        passed = (self.min is None or value >= self.min) and (self.max is None or value <= self.max)
        return Measurement(label, value, tolerance, passed, len(found), f"{len(found)} samples")


def _injection(journal: Journal, step: str) -> float | None:
    """When ``step`` was injected (None: never, or its injection failed)."""
    return next((f.at for f in journal.injections((step,))), None)


class DnsAnswers(_Probe):
    """Audit the answers for one DNS name: none may contain an excluded region, each
    must contain the required ones, and (unless ``allow_empty``) none may be empty
    (NODATA/NXDOMAIN) — fail open means an answer is always given."""

    probe: Literal["dns_answers"] = "dns_answers"
    dns_name: str = Field(min_length=1, max_length=253)
    exclude_regions: tuple[Identifier, ...] = ()
    require_regions: tuple[Identifier, ...] = ()
    allow_empty: bool = True
    max: int = Field(default=0, ge=0)

    def measure(self, journal: Journal) -> Measurement:
        label = self.label(f"bad DNS answers for {self.dns_name}")
        tolerance = f"≤ {self.max}"
        found = dns_in(journal, self.window, self.skip_s, self.dns_name)
        if found is None:
            return _not_reached(label, tolerance, self.window)
        bad = [d for d in found if not self._good(d)]
        detail = (
            f"{len(bad)}/{len(found)} bad; first at t={bad[0].at:.2f}s: "
            f"{bad[0].rcode} {','.join(bad[0].regions) or 'no answer'}"
            if bad
            else f"{len(found)} answers checked"
        )
        return Measurement(
            label,
            float(len(bad)),
            tolerance,
            len(bad) <= self.max and bool(found),
            len(found),
            detail,
        )

    def _good(self, record: DnsRecord) -> bool:
        if not record.regions:
            return self.allow_empty and not self.require_regions
        if any(r in self.exclude_regions for r in record.regions):
            return False
        return all(r in record.regions for r in self.require_regions)


class FailoverTime(_Probe):
    """Time from a fault's injection to the last request or DNS answer that still went
    to the dead target: the last answer naming a target region, the last request
    served by one, or the last request that needed a retry or failed without an HTTP
    answer or with a 5xx (its attempt hit the dead target). 0 when nothing went there
    after the fault."""

    probe: Literal["failover_time"] = "failover_time"
    #: The method step whose injection starts the clock.
    step: str = Field(min_length=1)
    max_s: float = Field(gt=0.0)
    #: Dead targets (regions); default: what the fault reports as its targets.
    targets: tuple[str, ...] = ()
    #: DNS names whose answers are watched (default: every name polled).
    dns_names: tuple[str, ...] = ()
    #: A request whose TTFT exceeds this also went to the dead target: a black-holed or
    #: stalled GPU shows from outside only as time (the load does not see GPU ids).
    slow_ms: float | None = Field(default=None, gt=0.0)

    def measure(self, journal: Journal) -> Measurement:
        label = self.name or f"failover time after {self.step}"
        tolerance = f"≤ {self.max_s:g} s"
        inject = next(iter(journal.injections((self.step,))), None)
        if inject is None:
            return Measurement(label, None, tolerance, False, 0, f"step {self.step} never injected")
        end = next(
            (
                f.at
                for f in journal.faults
                if f.step == self.step and f.action is FaultAction.ROLLBACK
            ),
            journal.ended_at if journal.ended_at is not None else math.inf,
        )
        targets = set(self.targets or inject.targets)
        names = {_fqdn(n) for n in self.dns_names}
        last, samples, culprit = inject.at, 0, "nothing went to the dead target"
        for d in journal.dns:
            if inject.at <= d.at < end and (not names or _fqdn(d.name) in names):
                samples += 1
                if targets.intersection(d.regions) and d.at > last:
                    last, culprit = d.at, f"DNS {d.name} → {','.join(d.regions)}"
        for r in journal.requests:
            if inject.at <= r.sent_at < end:
                samples += 1
                slow = (
                    self.slow_ms is not None
                    and r.ttft_s is not None
                    and 1000.0 * r.ttft_s > self.slow_ms
                )
                hit = (
                    (r.ok and r.region in targets)
                    or r.attempts > 1
                    or dead_target_failure(r)
                    or slow
                )
                if hit and r.sent_at > last:
                    last, culprit = r.sent_at, _describe(r)
        value = last - inject.at
        return Measurement(
            label,
            value,
            tolerance,
            value <= self.max_s and samples > 0,
            samples,
            f"last: {culprit}",
        )


def _describe(record: RequestRecord) -> str:
    if record.ok and record.ttft_s is not None and record.attempts == 1:
        return (
            f"request at t={record.sent_at:.2f}s served by {record.region}, "
            f"TTFT {1000 * record.ttft_s:.0f} ms"
        )
    if record.ok:
        where = record.region + (
            f" after {record.attempts} attempts" if record.attempts > 1 else ""
        )
        return f"request at t={record.sent_at:.2f}s served by {where}"
    return f"request at t={record.sent_at:.2f}s failed ({record.status} {record.reason})"


class Oscillation(_Probe):
    """How often a region entered or left the answers for a DNS name (failback: the
    region comes back once — 1 change — and stays). Measured: changes in the window."""

    probe: Literal["oscillation"] = "oscillation"
    dns_name: str = Field(min_length=1, max_length=253)
    region: Identifier
    max: int = Field(ge=0)

    def measure(self, journal: Journal) -> Measurement:
        label = self.label(f"{self.region} in/out changes for {self.dns_name}")
        tolerance = f"≤ {self.max}"
        found = dns_in(journal, self.window, self.skip_s, self.dns_name)
        if found is None:
            return _not_reached(label, tolerance, self.window)
        changes = count_changes([self.region in d.regions for d in found if d.rcode == "NOERROR"])
        return Measurement(
            label, float(changes), tolerance, changes <= self.max and bool(found), len(found)
        )


def count_changes(states: Sequence[bool]) -> int:
    """Number of flips in a sequence of states."""
    return sum(1 for a, b in itertools.pairwise(states) if a != b)


Probe = Annotated[
    SuccessRate
    | TtftP99
    | ResidencyViolations
    | RefusalCodes
    | RequestsLost
    | RetryRatio
    | SpillShare
    | SpillCount
    | StatusCount
    | CutStreams
    | RegionShare
    | FaultRefused
    | MetricValue
    | DnsAnswers
    | FailoverTime
    | Oscillation,
    Field(discriminator="probe"),
]


def measure_all(probes: Sequence[Probe], journal: Journal) -> list[Measurement]:
    return [p.measure(journal) for p in probes]


def request_counts(journal: Journal) -> tuple[int, int, int]:
    """(requests, lost, retried) of the whole run."""
    lost = sum(1 for r in journal.requests if not r.ok)
    retried = sum(1 for r in journal.requests if r.attempts > 1)
    return len(journal.requests), lost, retried
