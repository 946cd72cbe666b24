"""GPU health: active checks, passive outlier detection, slow start, throughput regression.

A pure state machine over an injected clock; the agent feeds it check results and
request outcomes, and reads one :class:`HealthStatus` per GPU when it builds a view.

Active checks (HAProxy's model, ``rise``/``fall``): ``GET /health`` every
``check_interval_s``; a GPU goes down after ``fall`` consecutive failures and comes back
after ``rise`` consecutive successes. A GPU is not routed to before its first
successful check (or scrape).

Passive outlier detection (Envoy's ``outlier_detection``): ``consecutive_failures``
5xx / timeouts / resets in a row eject the GPU for ``base_ejection_s`` × the number of
times it was ejected (capped at ``max_ejection_s``; the count decays by one per
``max_ejection_s`` without an ejection), never more than ``max_ejected_fraction`` of the
zone at once (but at least one GPU, as Envoy does). When the time is up the GPU is
*half-open*: it takes one trial request at a time; a success closes it, a failure
ejects it again at once.

Slow start (Envoy's ``slow_start_config``): a GPU that was just added, came back up or
back from ejection has its weight ramped linearly from ``slow_start_min_weight`` to 1
over ``slow_start_s``; the cost model divides its prefill rate by that weight, so a
cold or warming GPU (whose first passes are slower, and whose cache is empty) gets a
share of the traffic that grows with time.

Throughput regression: the inter-token latencies of scrape windows (engine time, from
the histogram's ``_sum``/``_count`` deltas) are divided by what the profile expects of
them: the decode steps at the scraped batch, plus what the prompts prefilled meanwhile
added to those steps (:func:`zone_agent.calibration.decode_window`). Windows add up into
one sample, which closes when it holds ``regression_min_tokens`` tokens or
``regression_min_engine_s`` of decode time (a very slow GPU emits few tokens per scrape,
and it is the one that must be seen) *and* no prompt is half-prefilled at its end. A
prompt's prefill is counted when its first token comes out (by the agent, which sent
it), while its chunks slowed every pass before that: a sample cut in the middle of a
prefill holds the slow passes without their cause, and the next one the cause without
the passes. Under a load that never lets a GPU settle, a sample closes anyway after
``regression_span_s``. Such a *forced* sample is far less sure (the prompts cut off at
its ends, and a burst of admissions that prefill together while the engine counts them
as running, move it both ways; the CHANGELOG has the spread measured), so it counts only
when it is ``regression_forced_factor`` times slower than the profile (a GPU failing
grey under load is seen; a mild throttle waits for a settled moment), and it never sets
the GPU's best (below). The smoothed ratio (EWMA) is compared with two
references, and the GPU is de-weighted by the larger slowness, so its predicted TTFT
grows by as much as it slowed down:

* the zone's median: ``regression_threshold`` above it (a thermally throttled GPU is
  25 % slower, NVIDIA's "HW Thermal Slowdown") — a GPU slower than its peers;
* the GPU's own best over the last ``regression_window_s`` (a windowed minimum, as BBR
  keeps its ``min_rtt``): ``regression_self_factor`` times it — a gray failure of a GPU
  that has no peer to compare with (alone in its zone) or of a whole zone at once,
  which the median cannot see. The factor is coarse because a GPU's own ratio moves
  with its batch mix and its host's load, which the profile does not model.

A slowed GPU draws little traffic, so its estimate would never be corrected: with no
sample for ``regression_stale_s`` its excess over its best decays with a half-life of
``regression_recovery_s`` (the regression's analogue of an ejection ending), until
new traffic measures it again; a window that much faster than the estimate replaces it
at once (a recovered GPU is not blended back over many windows).
"""

from __future__ import annotations

import asyncio
import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

import aiohttp
from pydantic import Field

from gtm.models import Frozen


class HealthConfig(Frozen):
    """Health-check and outlier-detection settings (defaults cited in the module doc)."""

    #: HAProxy's defaults: ``inter 2s``, ``rise 2``, ``fall 3``.
    check_interval_s: float = Field(default=2.0, gt=0.0)
    check_timeout_s: float = Field(default=1.0, gt=0.0)
    rise: int = Field(default=2, ge=1)
    fall: int = Field(default=3, ge=1)
    #: Envoy's defaults: ``consecutive_5xx: 5``, ``base_ejection_time: 30s``,
    #: ``max_ejection_time: 300s``, ``max_ejection_percent: 10``.
    consecutive_failures: int = Field(default=5, ge=1)
    #: Missed first-byte deadlines in a row that eject at once. The deadline is already
    #: generous (max(5 s, 4 × predicted TTFT), ``zone_agent.proxy``), so two misses are
    #: strong evidence of a black hole — and each released miss makes the silent GPU look
    #: idle again, drawing new requests in until it is ejected (chaos ``black-holed-gpu``).
    consecutive_timeouts: int = Field(default=2, ge=1)
    base_ejection_s: float = Field(default=30.0, gt=0.0)
    max_ejection_s: float = Field(default=300.0, gt=0.0)
    max_ejected_fraction: float = Field(default=0.1, ge=0.0, le=1.0)
    #: Envoy's ``min_weight_percent`` default is 10 %; its slow-start window has no
    #: default, 30 s covers the emulator's 64 warm-up passes at any realistic pace.
    slow_start_s: float = Field(default=30.0, ge=0.0)
    slow_start_min_weight: float = Field(default=0.1, gt=0.0, le=1.0)
    #: De-weight a GPU whose decode is this much slower than the zone's median. 0.15
    #: catches a 20 %-throughput throttle (25 % slower) with room for noise.
    regression_threshold: float = Field(default=0.15, gt=0.0)
    #: Weight of a new sample in the smoothed slowness (EWMA).
    regression_alpha: float = Field(default=0.3, gt=0.0, le=1.0)
    #: Fewest decoded tokens in a scrape window for its latency to count…
    regression_min_tokens: int = Field(default=16, ge=1)
    #: …or least decode time in it (seconds of inter-token latency summed).
    regression_min_engine_s: float = Field(default=0.1, gt=0.0)
    #: A sample whose end finds a prompt half-prefilled still closes after this long.
    regression_span_s: float = Field(default=4.0, gt=0.0)
    #: …and counts only when it is this many times slower than the profile.
    regression_forced_factor: float = Field(default=10.0, gt=1.0)
    #: De-weight a GPU this many times slower than its own best in the window.
    regression_self_factor: float = Field(default=3.0, gt=1.0)
    #: How long a GPU's best ratio is remembered (then re-measured from the current one).
    regression_window_s: float = Field(default=600.0, gt=0.0)
    #: Without a sample for this long, a slowness estimate starts decaying…
    regression_stale_s: float = Field(default=5.0, gt=0.0)
    #: …with this half-life (of its excess over the GPU's best).
    regression_recovery_s: float = Field(default=5.0, gt=0.0)


class Outcome(StrEnum):
    """How a proxied request ended, for passive outlier detection."""

    SUCCESS = "success"
    ERROR_5XX = "5xx"
    TIMEOUT = "timeout"
    RESET = "reset"
    CONNECT = "connect"


@dataclass(frozen=True, slots=True)
class HealthStatus:
    """One GPU's health as a decision sees it."""

    eligible: bool
    reason: str | None = None
    #: Multiplies the GPU's prefill rate: slow start × throughput regression, in (0, 1].
    weight: float = 1.0
    #: Back from ejection on trial: only one request at a time until a success.
    half_open: bool = False
    #: Measured decode slowness relative to the zone's median or the GPU's own best
    #: (1.0 = normal; see the module docstring).
    slowdown: float = 1.0
    #: The slow-start part of ``weight``, in (0, 1]: a preference for ramping traffic,
    #: not a slower GPU, so an absolute TTFT prediction (an SLO's) multiplies it back.
    ramp: float = 1.0


class _Gpu:
    __slots__ = (
        "acc_expected",
        "acc_seconds",
        "acc_since",
        "acc_tokens",
        "best",
        "best_at",
        "checked",
        "ejected_at",
        "ejected_until",
        "ejections",
        "fail_streak",
        "half_open",
        "ok_streak",
        "passive_streak",
        "sampled_at",
        "slowness",
        "timeout_streak",
        "up",
        "up_since",
    )

    def __init__(self, now: float) -> None:
        self.checked = False
        self.up = False
        self.ok_streak = 0
        self.fail_streak = 0
        self.passive_streak = 0
        self.timeout_streak = 0
        self.ejected_until: float | None = None
        self.ejected_at = -math.inf
        self.ejections = 0
        self.half_open = False
        self.up_since = now
        self.slowness: float | None = None
        #: The lowest smoothed slowness in the window, and when it was set.
        self.best = math.inf
        self.best_at = now
        self.sampled_at = now
        #: The open sample: windows added since the last one closed.
        self.acc_tokens = 0.0
        self.acc_seconds = 0.0
        self.acc_expected = 0.0
        self.acc_since: float | None = None


class HealthTracker:
    """Health of every GPU of the zone; see the module docstring."""

    def __init__(self, config: HealthConfig | None = None) -> None:
        self.config = config or HealthConfig()
        self._gpus: dict[str, _Gpu] = {}

    def sync(self, gpu_ids: Iterable[str], now: float) -> None:
        """Track exactly these GPUs (new ones start unchecked, in slow start)."""
        wanted = set(gpu_ids)
        for gone in set(self._gpus) - wanted:
            del self._gpus[gone]
        for new in wanted - set(self._gpus):
            self._gpus[new] = _Gpu(now)

    def _gpu(self, gpu_id: str, now: float) -> _Gpu:
        gpu = self._gpus.get(gpu_id)
        if gpu is None:
            gpu = self._gpus[gpu_id] = _Gpu(now)
        return gpu

    # ------------------------------------------------------------------ active checks

    def observe_check(self, gpu_id: str, ok: bool, now: float) -> bool:
        """Record an active check (or a successful scrape); return whether up/down changed."""
        cfg, gpu = self.config, self._gpu(gpu_id, now)
        was = gpu.up
        if ok:
            gpu.ok_streak += 1
            gpu.fail_streak = 0
            if not gpu.checked or (not gpu.up and gpu.ok_streak >= cfg.rise):
                if not gpu.up:
                    gpu.up_since = now
                gpu.up = True
        else:
            gpu.fail_streak += 1
            gpu.ok_streak = 0
            if not gpu.checked or gpu.fail_streak >= cfg.fall:
                gpu.up = False
        gpu.checked = True
        return gpu.up != was

    # ------------------------------------------------------------------ passive

    def record(self, gpu_id: str, outcome: Outcome, now: float) -> bool:
        """Record a request's outcome; return True if it got the GPU ejected."""
        gpu = self._gpus.get(gpu_id) or self._gpu(gpu_id, now)
        if outcome is Outcome.SUCCESS:
            gpu.passive_streak = 0
            gpu.timeout_streak = 0
            gpu.half_open = False
            return False
        gpu.passive_streak += 1
        gpu.timeout_streak = gpu.timeout_streak + 1 if outcome is Outcome.TIMEOUT else 0
        if gpu.ejected_until is not None and gpu.ejected_until > now:
            return False
        if (
            gpu.half_open
            or gpu.passive_streak >= self.config.consecutive_failures
            or gpu.timeout_streak >= self.config.consecutive_timeouts
        ):
            return self._eject(gpu, now)
        return False

    def _ejected_count(self, now: float) -> int:
        return sum(
            1 for g in self._gpus.values() if g.ejected_until is not None and g.ejected_until > now
        )

    def _eject(self, gpu: _Gpu, now: float) -> bool:
        cfg = self.config
        allowed = max(1, math.floor(cfg.max_ejected_fraction * len(self._gpus)))
        if self._ejected_count(now) >= allowed:
            return False
        decayed = int((now - gpu.ejected_at) // cfg.max_ejection_s) if gpu.ejections else 0
        gpu.ejections = max(0, gpu.ejections - decayed) + 1
        gpu.ejected_at = now
        gpu.ejected_until = now + min(cfg.max_ejection_s, cfg.base_ejection_s * gpu.ejections)
        gpu.half_open = False
        gpu.passive_streak = 0
        gpu.timeout_streak = 0
        return True

    def ejected_until(self, gpu_id: str) -> float | None:
        gpu = self._gpus.get(gpu_id)
        return None if gpu is None else gpu.ejected_until

    def next_expiry(self, now: float) -> float | None:
        """When the next ejection ends (the agent rebuilds its view then)."""
        ends = [
            g.ejected_until
            for g in self._gpus.values()
            if g.ejected_until and g.ejected_until > now
        ]
        return min(ends) if ends else None

    # ------------------------------------------------------------------ regression

    def observe_decode(
        self,
        gpu_id: str,
        observed_s: float,
        expected_s: float,
        tokens: float,
        now: float,
        *,
        settled: bool = True,
    ) -> None:
        """A scrape window's mean inter-token latency vs what the profile expects of it;
        ``settled``: no prompt was half-prefilled at the window's end (the caller's own
        requests all had their first token), so a sample may close here."""
        cfg = self.config
        if expected_s <= 0 or not observed_s > 0 or tokens <= 0:
            return
        gpu = self._gpu(gpu_id, now)
        if gpu.acc_since is None:
            gpu.acc_since = now
        gpu.acc_tokens += tokens
        gpu.acc_seconds += observed_s * tokens
        gpu.acc_expected += expected_s * tokens
        if gpu.acc_tokens < cfg.regression_min_tokens and (
            gpu.acc_seconds < cfg.regression_min_engine_s
        ):
            return
        if not settled and now - gpu.acc_since < cfg.regression_span_s:
            return
        sample = gpu.acc_seconds / gpu.acc_expected
        gpu.acc_tokens = gpu.acc_seconds = gpu.acc_expected = 0.0
        gpu.acc_since = None
        if not settled and sample < cfg.regression_forced_factor:
            return  # within what the prompts cut off at its ends can do: no news
        current = self._slowness(gpu, now)
        alpha = cfg.regression_alpha
        if current is None or sample * cfg.regression_self_factor <= current:
            # A GPU is never faster than it is: a window this much faster than the
            # estimate is a recovery, taken at once (a blend would keep a recovered GPU
            # de-weighted for many windows, and a de-weighted GPU gets few windows).
            gpu.slowness = sample
        else:
            gpu.slowness = alpha * sample + (1 - alpha) * current
        gpu.sampled_at = now
        if not settled:
            return  # a forced sample's error could set a best no settled sample reaches
        if gpu.slowness <= gpu.best or now - gpu.best_at > cfg.regression_window_s:
            gpu.best, gpu.best_at = gpu.slowness, now

    def _slowness(self, gpu: _Gpu, now: float) -> float | None:
        """The smoothed slowness, its excess over the GPU's best decayed when stale."""
        if gpu.slowness is None:
            return None
        cfg = self.config
        stale = now - gpu.sampled_at - cfg.regression_stale_s
        if stale <= 0 or not gpu.slowness > gpu.best:
            return gpu.slowness
        decay = math.pow(0.5, stale / cfg.regression_recovery_s)
        return gpu.best + (gpu.slowness - gpu.best) * decay

    def slowdowns(self, now: float) -> Mapping[str, float]:
        """Each measured GPU's slowness (1.0 = typical; see the module docstring)."""
        cfg = self.config
        measured: dict[str, tuple[float, float]] = {}
        for gid, gpu in self._gpus.items():
            value = self._slowness(gpu, now)
            if value is not None:
                measured[gid] = (value, gpu.best)
        if not measured:
            return {}
        reference = statistics.median(value for value, _ in measured.values())
        if reference <= 0:
            return {}
        out: dict[str, float] = {}
        for gid, (value, best) in measured.items():
            own = value / best if best > 0 else 1.0
            out[gid] = max(value / reference, own if own >= cfg.regression_self_factor else 0.0)
        return out

    # ------------------------------------------------------------------ reading

    def status(self, gpu_id: str, now: float, slowdown: float = 1.0) -> HealthStatus:
        """The GPU's health now (ends an ejection whose time is up: half-open)."""
        cfg, gpu = self.config, self._gpu(gpu_id, now)
        if gpu.ejected_until is not None:
            if gpu.ejected_until > now:
                return HealthStatus(False, f"ejected (outlier) until t={gpu.ejected_until:.1f}")
            gpu.ejected_until = None
            gpu.half_open = True
            gpu.up_since = now
        if not gpu.checked:
            return HealthStatus(False, "not checked yet")
        if not gpu.up:
            return HealthStatus(False, f"failed {gpu.fail_streak} health checks")
        ramp = 1.0
        if cfg.slow_start_s > 0:
            ramp = max(cfg.slow_start_min_weight, min(1.0, (now - gpu.up_since) / cfg.slow_start_s))
        weight = ramp
        if slowdown >= 1.0 + cfg.regression_threshold:
            weight /= slowdown
        return HealthStatus(True, None, weight, gpu.half_open, slowdown, ramp)


async def probe(session: aiohttp.ClientSession, url: str, timeout_s: float) -> bool:
    """One active check: ``GET {url}/health`` answers 2xx within ``timeout_s``."""
    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(url.rstrip("/") + "/health") as response:
                await response.read()
                return 200 <= response.status < 300
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False
