"""Each worker's profile, calibrated online from the worker's own metrics (sans-io).

A worker is priced by the profile of its (GPU type, model) — an operator's file, else
the shipped one — until its own metrics say otherwise. Two figures are measured, each
as a *speed factor* against the worker's reference profile (> 1: faster than it):

* **prefill**, from the per-request histograms engines observe as requests finish:
  vLLM's ``request_prefill_time_seconds`` with ``request_prefill_kv_computed_tokens``
  (else ``request_prompt_tokens`` less prefix-cache hits); SGLang's TTFT less queue
  time with ``prompt_tokens_total`` less ``cached_tokens_total``. Between two scrapes
  the deltas give ``n`` requests, ``T`` computed prompt tokens and ``S`` prefill
  seconds; the reference would have taken ``E = n · prefill_time_s(T / n)``, and the
  factor is ``E / S`` — both less the fixed per-pass overhead, which no hardware
  speed scales (so a profile scaled by the factor predicts the measured time).
* **decode**, from the inter-token latency histogram: observed mean step against the
  reference's ``decode_step_s`` at the scraped batch and context.

Robustness. Deltas accumulate until a sample holds :data:`MIN_REQUESTS` requests (or
:data:`MIN_DECODE_TOKENS` tokens), so one request's noise never sets a price. A counter
that goes down (the engine restarted) drops the baseline, not the samples. A request's
measured prefill includes every pass it shared with others (their chunks, the running
batch's decode tokens), so contention only ever makes a worker look *slower*; the
factor is therefore a high quantile (:data:`QUANTILE`) of the last :data:`SAMPLES_KEPT`
samples rather than their mean — the least-contended samples are nearest the
hardware — and not the maximum, so one lucky sample does not set it either. Samples
older than :data:`MAX_SAMPLE_AGE_S` are forgotten (the time is the caller's clock).

Pricing. A worker whose pair has a profile is priced by it (source ``shipped`` or
``file``) unless its prefill factor, measured in its quiet intervals
(:data:`QUIET_RUNNING`), is off by more than :data:`DRIFT_THRESHOLD`; then
by the profile scaled to what it measures (``calibrated``). A pair without a profile is
never priced as another GPU silently: it is logged once (GPU type, model, and what to do)
and priced by a *conservative prior* (``prior``) — the slowest profile gtm has of that
model (of any generative model when the model is unknown too) — until it has
:data:`MIN_SAMPLES` prefill samples (``MIN_SAMPLES × MIN_REQUESTS`` finished requests),
then by the prior scaled to its measurements (``calibrated``). Slowest, because the two
errors are not alike: a fast GPU priced slow gets fewer requests for a few seconds,
a slow GPU priced fast is flooded and misses every SLO until calibration catches up.

The :class:`Calibrator` keeps mutable per-worker state, updated once per scrape round
by the agent's loop; decisions never see it: they read the immutable view, into which
:meth:`Calibrator.priced` is copied when the view is rebuilt.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass, field, replace

from gtm.gpu_profiles import GpuProfile, ModelKind, ProfileCatalog, ProfileSource
from zone_agent.scrape import ModelMetrics

log = logging.getLogger(__name__)

#: Finished requests per prefill sample, and decode tokens per decode sample.
MIN_REQUESTS = 8
MIN_DECODE_TOKENS = 128
#: Prefill samples before an estimate counts (so an unknown pair is calibrated after at
#: most ``MIN_SAMPLES × MIN_REQUESTS`` finished requests, plus those finishing in the
#: scrape intervals that close the samples).
MIN_SAMPLES = 3
SAMPLES_KEPT = 8
QUANTILE = 0.75
#: Relative difference between measured and profiled speed beyond which a worker with a
#: profile is priced by its measurements. Wide enough for the roofline's own error and
#: for contention the quantile does not remove; narrow enough to catch a worker running
#: at two thirds of its profile (thermal throttling costs ~20 %, a wrong TP degree 2×).
DRIFT_THRESHOLD = 0.25
#: Prefill deltas whose prompts (computed tokens per request) are shorter than this many
#: times the reference's compute/memory crossover (weight read × prefill rate) are not
#: samples: a short prompt's pass is bound by reading the weights, so it would scale the
#: prefill rate by the bandwidth ratio — for a prior of another GPU, a wrong price in
#: the dangerous direction. A worker that only sees short prompts stays on its profile
#: (or its prior) until longer ones arrive.
COMPUTE_BOUND_MARGIN = 2.0
MAX_SAMPLE_AGE_S = 900.0
#: A worker that has a profile is measured in its quiet intervals only: at most this
#: many requests in the engine (running or waiting) at both scrapes. Under load every request
#: shares its passes with others' chunks and decode tokens and so looks slower, for
#: reasons the cost model already counts (queued tokens, decode pressure); measuring
#: then would count them twice and re-price a healthy GPU. A throttled or misprofiled
#: GPU is slower when quiet too. A pair priced by the prior has nothing better to go
#: by, so every interval counts for it (contention errs on the slow, safe side).
QUIET_RUNNING = 2


@dataclass(frozen=True, slots=True)
class PrefillCounters:
    """Cumulative prefill figures of one (worker, model), as engines count them."""

    requests: float
    seconds: float
    tokens: float


def prefill_counters(metrics: ModelMetrics) -> PrefillCounters | None:
    """The worker's cumulative prefill requests, seconds and computed tokens (None: the
    engine does not expose enough to tell)."""
    m = metrics
    if m.prefill_time_sum is not None and m.prefill_time_count is not None:
        requests, seconds = m.prefill_time_count, m.prefill_time_sum
    elif m.ttft_sum is not None and m.ttft_count is not None and m.queue_time_sum is not None:
        requests, seconds = m.ttft_count, m.ttft_sum - m.queue_time_sum
    else:
        return None
    if m.computed_tokens_sum is not None:
        tokens = m.computed_tokens_sum
    elif m.prompt_tokens_sum is not None:
        spared = m.cached_tokens if m.cached_tokens is not None else (m.prefix_hits or 0.0)
        tokens = m.prompt_tokens_sum - spared
    else:
        return None
    return PrefillCounters(requests, seconds, tokens)


@dataclass(frozen=True, slots=True)
class DecodeWindow:
    """One scrape interval's decoding: its inter-token gaps, their sum, and what the
    profile expects that sum to be."""

    tokens: float
    seconds: float
    #: The decode steps alone: ``tokens`` × the step at the scraped batch and context.
    steps_s: float
    #: What the interval's prefills added to those gaps (:func:`decode_window`).
    interference_s: float

    @property
    def expected_s(self) -> float:
        return self.steps_s + self.interference_s


def decode_window(
    profile: GpuProfile,
    last: ModelMetrics,
    now: ModelMetrics,
    *,
    decoding: tuple[float, float] | None = None,
    prefilled: PrefillCounters | None = None,
) -> DecodeWindow | None:
    """The decoding between two scrapes of one (worker, model), priced by ``profile``
    (None: no inter-token latencies, none decoded, or a counter reset).

    An inter-token gap is one pass, and a pass that also prefills a prompt's chunk is
    longer for every sequence decoding in it. So the gaps' expected sum is the decode
    steps plus, for each prompt prefilled in the window,
    :meth:`~gtm.gpu_profiles.GpuProfile.prefill_interference_s` × the sequences that
    were decoding meanwhile. Without it a prefill-bound worker reads as many times
    slower than its profile (its sequences wait for other prompts' chunks), which is
    load, not a slow GPU.

    Only the caller that sent the requests knows the prompts, and passes them:
    ``prefilled``, the prompts answered in the window (requests and uncached tokens,
    counted at their first token, when their prefill ends). The engine's own prefill
    counters would not do: vLLM observes its prefill histograms only when a request
    *finishes*, many windows after the passes its chunks slowed. Without ``prefilled``
    nothing is added to the steps. ``decoding``: the sequences decoding at the window's
    two ends, when the caller knows them (a burst of admissions prefills together while
    the engine counts it as running); else the running ones less the one prefilling."""
    if last.itl_count is None or last.itl_sum is None:
        return None
    if now.itl_count is None or now.itl_sum is None:
        return None
    tokens, seconds = now.itl_count - last.itl_count, now.itl_sum - last.itl_sum
    if tokens <= 0 or seconds <= 0:
        return None
    batch = max(1.0, now.running)
    blocks = now.kv_blocks_total or profile.num_gpu_blocks
    size = now.block_size or profile.block_size
    context = (now.kv_usage or 0.0) * blocks * size / batch
    steps = tokens * profile.decode_step_s(int(batch), context)
    interference = 0.0
    if prefilled is not None and prefilled.requests > 0 and prefilled.tokens > 0:
        if decoding is None:
            decoding = (last.running - 1, now.running - 1)
        # Bounds on a caller's guess: a window that decoded tokens had a sequence
        # decoding, and no more decode than the engine runs (a non-streamed request is
        # answered at its end, so the agent still counts a decoding one as prefilling).
        running = max(1.0, (last.running + now.running) / 2)
        sharing = min(running, max(1.0, (decoding[0] + decoding[1]) / 2))
        each = profile.prefill_interference_s(max(1, round(prefilled.tokens / prefilled.requests)))
        interference = prefilled.requests * each * sharing
    return DecodeWindow(tokens, seconds, steps, interference)


def scaled(
    profile: GpuProfile, gpu_type: str, prefill_factor: float, decode_factor: float
) -> GpuProfile:
    """``profile`` made ``prefill_factor`` × faster in compute and ``decode_factor`` × in
    memory reads, declared as ``gpu_type`` (the fixed per-pass overhead is kept)."""
    return replace(
        profile,
        gpu_type=gpu_type,
        prefill_tokens_per_s=profile.prefill_tokens_per_s * prefill_factor,
        attention_s_per_pair=profile.attention_s_per_pair / prefill_factor,
        weight_read_s=profile.weight_read_s / decode_factor,
        kv_read_s_per_token=profile.kv_read_s_per_token / decode_factor,
    )


@dataclass(frozen=True, slots=True)
class Prior:
    profile: GpuProfile
    #: "GPU × model" of the profile it stands in with.
    source_pair: str


def prior_profile(catalog: ProfileCatalog, gpu_type: str, model: str) -> Prior:
    """The conservative stand-in for a pair without a profile: the slowest profile of
    ``model`` in ``catalog`` (of any generative model if ``model`` has none), declared
    as ``gpu_type`` × ``model``. LookupError when the catalog is empty."""
    same_model = [e.profile for e in catalog if e.profile.model == model]
    candidates = same_model or [e.profile for e in catalog if e.profile.kind is ModelKind.GENERATE]
    if not candidates:
        raise LookupError(f"no profile at all to price {model!r} on {gpu_type!r} by")
    base = min(candidates, key=lambda p: (p.prefill_tokens_per_s, p.gpu_type, p.model))
    return Prior(replace(base, gpu_type=gpu_type, model=model), f"{base.gpu_type} × {base.model}")


def _quiet(last: ModelMetrics, now: ModelMetrics) -> bool:
    return max(last.running + last.waiting, now.running + now.waiting) <= QUIET_RUNNING


def _variable(measured: float, fixed: float) -> float:
    """The measured time less the fixed overhead (at least a tenth of it: a worker whose
    passes take less than the profile's overhead is still fast, not infinitely so)."""
    return max(measured - fixed, 0.1 * measured)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(slots=True)
class _Samples:
    """Factor samples of one figure, and the deltas accumulating towards the next."""

    values: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=SAMPLES_KEPT))
    pending_weight: float = 0.0  # requests (prefill) or tokens (decode)
    pending_expected: float = 0.0
    pending_measured: float = 0.0
    #: The factor as last computed (recomputed only when the samples change).
    cached: float | None = None
    dirty: bool = True

    def add(
        self, weight: float, expected: float, measured: float, minimum: float, now: float
    ) -> None:
        self.pending_weight += weight
        self.pending_expected += expected
        self.pending_measured += measured
        if self.pending_weight >= minimum and self.pending_measured > 0:
            self.record(now, self.pending_expected / self.pending_measured)
            self.pending_weight = self.pending_expected = self.pending_measured = 0.0

    def record(self, now: float, factor: float) -> None:
        self.values.append((now, factor))
        self.dirty = True

    def factor(self, now: float, minimum_samples: int) -> float | None:
        while self.values and now - self.values[0][0] > MAX_SAMPLE_AGE_S:
            self.values.popleft()
            self.dirty = True
        if self.dirty:
            self.dirty = False
            self.cached = (
                _quantile([v for _, v in self.values], QUANTILE)
                if len(self.values) >= minimum_samples
                else None
            )
        return self.cached


@dataclass(slots=True)
class _WorkerState:
    reference: GpuProfile
    source: ProfileSource
    last: ModelMetrics | None = None
    prefill: _Samples = field(default_factory=_Samples)
    decode: _Samples = field(default_factory=_Samples)
    #: Prefill deltas since the last prefill sample.
    pending: PrefillCounters = PrefillCounters(0.0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class Priced:
    """The profile a (worker, model) is priced by, and where it comes from."""

    profile: GpuProfile
    source: ProfileSource


class Calibrator:
    """Per-worker calibration state; :meth:`observe` after each scrape, :meth:`priced`
    when the view is rebuilt."""

    def __init__(
        self, catalog: ProfileCatalog, *, drift_threshold: float = DRIFT_THRESHOLD
    ) -> None:
        self.catalog = catalog
        self.drift_threshold = drift_threshold
        self._states: dict[tuple[str, str, str], _WorkerState] = {}
        self._warned: set[tuple[str, str]] = set()

    # ------------------------------------------------------------------ references

    def reference(self, gpu_type: str, model: str) -> Priced:
        """The operator's or shipped profile of the pair, else the conservative prior."""
        entry = self.catalog.entry(gpu_type, model)
        if entry is not None:
            return Priced(entry.profile, entry.source)
        return Priced(self._prior(gpu_type, model), ProfileSource.PRIOR)

    def _prior(self, gpu_type: str, model: str) -> GpuProfile:
        prior = prior_profile(self.catalog, gpu_type, model)
        key = (gpu_type, model)
        if key not in self._warned:
            self._warned.add(key)
            log.warning(
                "no performance profile for model %r on GPU type %r: priced as the slowest "
                "profile gtm has (%s) until its own metrics calibrate it; supply a profile "
                "with --profiles DIR (format: gtm.profile_files)",
                model,
                gpu_type,
                prior.source_pair,
            )
        return prior.profile

    def _state(self, gpu_id: str, gpu_type: str, model: str) -> _WorkerState:
        key = (gpu_id, gpu_type, model)
        state = self._states.get(key)
        if state is None:
            ref = self.reference(gpu_type, model)
            state = self._states[key] = _WorkerState(ref.profile, ref.source)
        return state

    # ------------------------------------------------------------------ observing

    def observe(
        self, gpu_id: str, gpu_type: str, model: str, metrics: ModelMetrics, now: float
    ) -> None:
        """One scrape of one (worker, model): fold the deltas since the last one in."""
        state = self._state(gpu_id, gpu_type, model)
        last, state.last = state.last, metrics
        if last is None:
            return
        if state.source is not ProfileSource.PRIOR and not _quiet(last, metrics):
            return  # this interval only moves the baseline (see QUIET_RUNNING)
        self._observe_prefill(state, last, metrics, now)
        self._observe_decode(state, last, metrics, now)

    def _observe_prefill(
        self, state: _WorkerState, last: ModelMetrics, now_m: ModelMetrics, now: float
    ) -> None:
        before, after = prefill_counters(last), prefill_counters(now_m)
        if after is None:
            return
        if before is None:
            # An engine writes a labelled histogram's series at its first observation:
            # absent before means zero (the worker's first requests are not lost).
            before = PrefillCounters(0.0, 0.0, 0.0)
        requests = after.requests - before.requests
        tokens = after.tokens - before.tokens
        if requests < 0 or tokens < 0:
            return  # a counter went down: the engine restarted; this scrape is the baseline
        # Deltas add up until a sample holds MIN_REQUESTS requests: the engines observe a
        # request's figures at slightly different moments (SGLang: TTFT at the first
        # token, queue time when scheduled), so one scrape's deltas may not line up;
        # their sums over several requests do.
        p = state.pending
        p = state.pending = PrefillCounters(
            p.requests + requests, p.seconds + after.seconds - before.seconds, p.tokens + tokens
        )
        if p.requests < MIN_REQUESTS:
            return
        state.pending = PrefillCounters(0.0, 0.0, 0.0)
        ref = state.reference
        per_request = max(1, round(p.tokens / p.requests))
        if p.seconds <= 0 or per_request < (
            COMPUTE_BOUND_MARGIN * ref.weight_read_s * ref.prefill_tokens_per_s
        ):
            return  # memory-bound prompts: they measure bandwidth, not the prefill rate
        # Compare what scales with the hardware: the fixed per-pass overhead is neither.
        passes = p.requests * math.ceil(per_request / ref.max_num_batched_tokens)
        fixed = passes * ref.step_overhead_s
        expected = p.requests * ref.prefill_time_s(per_request) - fixed
        state.prefill.record(now, expected / _variable(p.seconds, fixed))

    def _observe_decode(
        self, state: _WorkerState, last: ModelMetrics, now_m: ModelMetrics, now: float
    ) -> None:
        ref = state.reference
        # The decode steps alone (no ``prefilled``): an interval this quiet shares few
        # passes with prompts, and the calibrator does not know which prompts they were.
        window = decode_window(ref, last, now_m)
        if window is None:
            return  # idle, or a reset (handled like prefill's: this scrape is the baseline)
        fixed = window.tokens * ref.step_overhead_s  # each inter-token gap is one pass
        expected = window.expected_s - fixed
        state.decode.add(
            window.tokens, expected, _variable(window.seconds, fixed), MIN_DECODE_TOKENS, now
        )

    def forget(self, live: set[str]) -> None:
        """Drop the state of workers no longer in the zone."""
        for key in [k for k in self._states if k[0] not in live]:
            del self._states[key]

    # ------------------------------------------------------------------ pricing

    def factors(self, gpu_id: str, gpu_type: str, model: str, now: float) -> tuple[float, float]:
        """(prefill, decode) speed factors against the reference (1.0: not measured)."""
        state = self._states.get((gpu_id, gpu_type, model))
        if state is None:
            return 1.0, 1.0
        prefill = state.prefill.factor(now, MIN_SAMPLES)
        decode = state.decode.factor(now, MIN_SAMPLES)
        return prefill or 1.0, decode or 1.0

    def priced(self, gpu_id: str, gpu_type: str, model: str, now: float) -> Priced:
        """What the view prices this (worker, model) by now."""
        state = self._state(gpu_id, gpu_type, model)
        prefill = state.prefill.factor(now, MIN_SAMPLES)
        decode = state.decode.factor(now, MIN_SAMPLES)
        if state.source is ProfileSource.PRIOR:
            if prefill is None:
                return Priced(state.reference, ProfileSource.PRIOR)
            # Decode not measured yet: keep the prior's (slow) decode, conservatively.
            return Priced(
                scaled(state.reference, gpu_type, prefill, decode or 1.0),
                ProfileSource.CALIBRATED,
            )
        # A worker with a profile is re-priced when its prefill rate drifts (what its
        # price is made of); a slow decode alone is the health tracker's throughput
        # regression, judged against the same profile — and the inter-token latencies
        # of a quiet worker still include the passes that prefilled newcomers.
        if prefill is None or abs(prefill - 1.0) <= self.drift_threshold:
            return Priced(state.reference, state.source)
        drifted_decode = decode is not None and abs(decode - 1.0) > self.drift_threshold
        return Priced(
            scaled(
                state.reference,
                state.reference.gpu_type,
                prefill,
                decode if drifted_decode and decode is not None else 1.0,
            ),
            ProfileSource.CALIBRATED,
        )


__all__ = [
    "DRIFT_THRESHOLD",
    "MIN_REQUESTS",
    "MIN_SAMPLES",
    "Calibrator",
    "DecodeWindow",
    "PrefillCounters",
    "Priced",
    "Prior",
    "decode_window",
    "prefill_counters",
    "prior_profile",
    "scaled",
]
