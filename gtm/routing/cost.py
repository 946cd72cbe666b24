"""The one cost currency of every tier: predicted time-to-first-token, in ms (ARCHITECTURE §2).

::

    cost = network RTT to the candidate
         + queued uncached prefill tokens there / its prefill rate     (queueing)
         + this request's own uncached prefill tokens / its prefill rate
         + decode pressure (optional, for decode-bound traffic)

Pure functions, no state, no I/O: the live tiers and the fleet simulator price candidates
with exactly this code. It generalises GORGO's per-request rule ``RTT + unmatched·t_p``
(arXiv 2602.11688), Dynamo's prefill-block cost and llm-d's in-flight-token load: the
prefill rate comes from a per-(GPU type, model) profile, so heterogeneous GPUs are
weighted by what they can do, and the prefix cache enters through the *uncached* token
counts, so cache affinity is a cost term bounded by load rather than a separate mode.

Scores are derived from costs with :func:`cost_to_score` (exponential decay of the excess
over the best candidate) and stickiness is kept fair with :func:`bounded_load_capacity`.
"""

from __future__ import annotations

import math
from collections.abc import Container, Mapping, Sequence
from typing import NamedTuple

from gtm.errors import RoutingError
from gtm.models import ModelLoad

#: Client→region RTT model: the least-squares line through the 2,350 directed Azure P50
#: inter-region RTTs against great-circle distance (data/latency/
#: azure_inter_region_rtt.csv; Microsoft, "Azure network round-trip latency statistics",
#: 30 days to 2025-06-29, CC BY 4.0). The fit gives 25.9 ms + 0.01430 ms/km (residual sd
#: 36 ms), re-checked against the CSV by tests/unit/gtm/routing/test_cost.py. The
#: intercept is the fixed cost of access networks, routing and serialisation; the slope
#: is 1.43× the 0.01 ms/km of a round trip in fibre (2 km at ~200,000 km/s), because real
#: paths are longer than great circles.
RTT_INTERCEPT_MS = 26.0
RTT_MS_PER_KM = 0.0143


class CostInputError(RoutingError, ValueError):
    """A cost function got an impossible input (negative tokens, NaN RTT...)."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise CostInputError(message)


def rtt_ms_from_distance(distance_km: float) -> float:
    """Estimated round-trip time over ``distance_km`` of great-circle distance, in ms.

    Use a measured RTT instead whenever there is one (region↔region: the Azure matrix);
    this is for client→region, where only the client's location is known.
    """
    _require(
        math.isfinite(distance_km) and distance_km >= 0.0,
        f"distance_km must be finite and >= 0, got {distance_km!r}",
    )
    return RTT_INTERCEPT_MS + RTT_MS_PER_KM * distance_km


def predicted_ttft_ms(
    rtt_ms: float,
    queued_uncached_prefill_tokens: float,
    own_uncached_prefill_tokens: float,
    prefill_tokens_per_s: float,
    decode_pressure_ms: float = 0.0,
) -> float:
    """Predicted time-to-first-token at a candidate, in ms.

    ``rtt + 1000·(queued + own) / prefill_tokens_per_s + decode_pressure``. The queue term
    assumes the candidate prefills its backlog at its profiled rate before this request
    (FCFS), as GORGO's ``t_p·queued_tokens`` and llm-d's ``in-flight tokens /
    peakPrefillThroughput`` do. Returns ``math.inf`` when the rate is 0 (nothing there can
    serve): such a candidate always loses, and :func:`cost_to_score` maps it to 0.
    """
    # One chained comparison on the hot path (NaN fails every comparison); name the
    # culprit only when something is wrong.
    if not (
        rtt_ms >= 0.0
        and queued_uncached_prefill_tokens >= 0
        and own_uncached_prefill_tokens >= 0
        and prefill_tokens_per_s >= 0.0
        and decode_pressure_ms >= 0.0
    ):
        _reject_ttft_inputs(
            rtt_ms=rtt_ms,
            queued_uncached_prefill_tokens=queued_uncached_prefill_tokens,
            own_uncached_prefill_tokens=own_uncached_prefill_tokens,
            prefill_tokens_per_s=prefill_tokens_per_s,
            decode_pressure_ms=decode_pressure_ms,
        )
    if prefill_tokens_per_s == 0.0:
        return math.inf
    prefill_ms = 1000.0 * (queued_uncached_prefill_tokens + own_uncached_prefill_tokens)
    return rtt_ms + prefill_ms / prefill_tokens_per_s + decode_pressure_ms


class PrefillTerms(NamedTuple):
    """A place's price for a request of ``n`` uncached prompt tokens, without the RTT:
    ``queue_ms + 1000·n·gpus / prefill_tokens_per_s`` (:func:`prefill_terms`): the wait,
    then the prompt on one GPU of the ``gpus`` whose rates sum to
    ``prefill_tokens_per_s`` (the class that takes it, or the whole place)."""

    #: Wait before the request's prefill starts (∞: nothing there can prefill).
    queue_ms: float
    gpus: int
    prefill_tokens_per_s: float

    @property
    def ms_per_token(self) -> float:
        """Prefill time per prompt token on the GPU that takes it (0: cannot prefill)."""
        rate = self.prefill_tokens_per_s
        return 1000.0 * self.gpus / rate if rate > 0.0 else 0.0


def prefill_options(
    load: ModelLoad, unseen_requests: float = 0.0, unseen_tokens: float = 0.0
) -> tuple[PrefillTerms, ...]:
    """The ways a request can start at a zone or region, as :class:`PrefillTerms`:

    * **at once on the fastest free GPU**, when a healthy GPU of some class is free
      (nothing waiting to prefill, room for a sequence: :class:`~gtm.models.
      GpuClassLoad`): ``(0, that class)``. ``unseen_requests`` (sent since the summary,
      not in it yet) take the free GPUs first, fastest first, as each tier's GPU
      choice would place them;
    * **after the pooled backlog** ``1000·(queued + unseen_tokens) / rate`` (always
      listed, last): the GPU that frees first is of class ``c`` with probability
      ``rate_c / rate``, so its expected time per token is ``Σ (rate_c / rate)·
      (healthy_c / rate_c) = healthy / rate``, one GPU at the place's average rate.

    A request of ``n`` uncached tokens costs the least ``queue_ms + n × ms_per_token``
    of them (:func:`prefill_terms` when one line must do for every ``n``). A load
    without classes (a summary from before they existed) has the pooled line alone:
    priced exactly as before. Pricing by the average alone made a region whose fast
    GPUs idle beside slower ones look slow for long prompts and lose to one an ocean
    away. ``((∞, 0, 0),)`` when nothing healthy there can prefill.
    """
    rate = load.prefill_tokens_per_s
    if rate <= 0.0 or load.healthy_gpus <= 0:
        return (PrefillTerms(math.inf, 0, 0.0),)
    queued = load.queued_prefill_tokens + unseen_tokens
    pooled = PrefillTerms(1000.0 * queued / rate, load.healthy_gpus, rate)
    taken = unseen_requests
    for gpu_class in load.classes:  # fastest first
        free = gpu_class.free_gpus
        if free > taken and gpu_class.prefill_tokens_per_s > 0.0:
            now = PrefillTerms(0.0, gpu_class.healthy_gpus, gpu_class.prefill_tokens_per_s)
            return (now, pooled)
        taken -= free
    return (pooled,)


def prefill_terms(
    load: ModelLoad, unseen_requests: float = 0.0, unseen_tokens: float = 0.0
) -> PrefillTerms:
    """One line of :func:`prefill_options` for every prompt size (the global tier's
    columns are ``base + n × per_token``): the fastest free GPU when it is at least as
    fast as the place's average GPU — then it is the cheapest for every ``n`` (no wait,
    no slower a token) — else the pooled backlog, as before GPU classes. (When the
    only free GPUs are slower than the average, short prompts would start sooner on
    them, long ones after the backlog on a faster GPU; the pooled line keeps the
    long prompts' price honest, and the zone's own GPU choice takes the free GPU for
    the short ones.)"""
    options = prefill_options(load, unseen_requests, unseen_tokens)
    if len(options) == 2:
        now, pooled = options
        if now.ms_per_token <= pooled.ms_per_token:
            return now
        return pooled
    return options[0]


def without_turn(load: ModelLoad, tokens: int) -> ModelLoad:
    """``load`` without a finished request of ``tokens`` prompt tokens that it may
    still count as queued (a summary taken while it was prefilling): those tokens leave
    the queue, and the fastest GPU class with a queue and a GPU not free gets that GPU
    back free — the tiers place a request on the fastest free GPU, so that is the class
    that took it. A load that queues none of it is returned as it is (the request was
    decoding or done then: its GPU already counted as free). Used to price where a
    conversation's previous turn went (``sticky_region``, ``sticky_zone``)."""
    stale = min(tokens, load.queued_prefill_tokens)
    if stale <= 0:
        return load
    classes = list(load.classes)
    for i, c in enumerate(classes):
        if c.free_gpus < c.healthy_gpus and c.queued_prefill_tokens > 0:
            left = c.queued_prefill_tokens - min(stale, c.queued_prefill_tokens)
            update = {"free_gpus": c.free_gpus + 1, "queued_prefill_tokens": left}
            classes[i] = c.model_copy(update=update)
            break
    return load.model_copy(
        update={
            "queued_prefill_tokens": load.queued_prefill_tokens - stale,
            "classes": tuple(classes),
        }
    )


def _reject_ttft_inputs(**inputs: float) -> None:
    for label, value in inputs.items():
        _require(value >= 0.0, f"{label} must be >= 0, got {value!r}")


def matching_prefix_blocks(prefix_hashes: Sequence[int], cached: Container[int]) -> int:
    """How many leading blocks of the prompt are cached.

    Block hashes are prefix-chained (block *i*'s hash covers blocks 0..*i*, as in vLLM's
    automatic prefix caching), so a cached block only helps if every block before it is
    cached too: counting stops at the first miss. ``cached`` is any index of block hashes
    that supports ``in`` (a ``frozenset``, a ``dict`` keyed by hash, an LRU...).
    """
    matched = 0
    for block_hash in prefix_hashes:
        if block_hash not in cached:
            break
        matched += 1
    return matched


def uncached_tokens(
    input_tokens: int, prefix_hashes: Sequence[int], cached_prefix_blocks: int, block_tokens: int
) -> int:
    """Prompt tokens that still need prefill when ``cached_prefix_blocks`` leading blocks hit.

    Only whole blocks are hashed (and cached), so a hit saves ``block_tokens`` per block;
    the count of matching blocks cannot exceed the prompt's blocks. vLLM's default block
    is 16 tokens (``--block-size``); Mooncake traces use 512-token blocks.
    """
    _require(input_tokens >= 0, f"input_tokens must be >= 0, got {input_tokens!r}")
    _require(
        cached_prefix_blocks >= 0,
        f"cached_prefix_blocks must be >= 0, got {cached_prefix_blocks!r}",
    )
    _require(block_tokens > 0, f"block_tokens must be > 0, got {block_tokens!r}")
    hit_blocks = min(cached_prefix_blocks, len(prefix_hashes))
    return max(0, input_tokens - hit_blocks * block_tokens)


def cost_to_score(cost_ms: float, best_ms: float, scale_ms: float) -> float:
    """Map a cost to a score in [0, 1]: ``exp(-(cost - best) / scale)``.

    The best candidate scores 1 and every ``scale_ms`` of *extra* predicted TTFT costs a
    factor e. Normalising the excess rather than the ratio ``best / cost`` is deliberate:
    a user feels 100 ms more TTFT the same whether the best option is 30 ms or 300 ms
    away, a ratio would flatten all differences as soon as every candidate shares a large
    RTT, and it is undefined at a cost of 0. ``scale_ms`` is the trade-off knob: the TTFT
    slack the operator is willing to spend (e.g. the SLO minus the typical TTFT).
    An infinite or NaN cost scores 0.
    """
    _check_normalisation(best_ms, scale_ms)
    return _decay(cost_ms, best_ms, scale_ms)


def _check_normalisation(best_ms: float, scale_ms: float) -> None:
    # The messages are formatted only on failure: every scorer's decision checks this.
    if not (math.isfinite(scale_ms) and scale_ms > 0.0):
        raise CostInputError(f"scale_ms must be > 0, got {scale_ms!r}")
    if not math.isfinite(best_ms):
        raise CostInputError(f"best_ms must be finite, got {best_ms!r}")


def _decay(cost_ms: float, best_ms: float, scale_ms: float) -> float:
    excess = cost_ms - best_ms
    if excess <= 0.0:
        return 1.0
    if excess < math.inf:  # False for +inf and NaN
        return math.exp(-excess / scale_ms)
    return 0.0


def scores_from_costs(costs: Mapping[str, float], scale_ms: float) -> dict[str, float]:
    """Score every candidate's cost against the cheapest finite one (see :func:`cost_to_score`).

    If no cost is finite (nothing can serve anywhere), every score is 0.
    """
    best = min(filter(math.isfinite, costs.values()), default=None)
    if best is None:
        return dict.fromkeys(costs, 0.0)
    _check_normalisation(best, scale_ms)
    # _decay inlined: a scorer calls this on every decision over every candidate, and a
    # Python call per candidate was half of its cost.
    exp, inf = math.exp, math.inf
    return {
        cid: 1.0
        if (excess := cost - best) <= 0.0
        else exp(-excess / scale_ms)
        if excess < inf
        else 0.0
        for cid, cost in costs.items()
    }


def bounded_load_capacity(total_load: float, bins: int, epsilon: float) -> int:
    """Per-candidate load cap of consistent hashing with bounded loads: ``⌈(1+ε)·m/n⌉``.

    Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads" (SODA 2018):
    with ``m`` units of load over ``n`` bins, no bin takes more than ``⌈(1+ε)·m/n⌉``; a
    request whose sticky target is full moves on to the next candidate. Smaller ε balances
    more tightly at the price of more moves (expected O(1/ε²) per insertion). ``total_load``
    must include the request being placed, so the cap is never 0 for a non-empty fleet.
    """
    _require(bins > 0, f"bins must be > 0, got {bins!r}")
    _require(math.isfinite(epsilon) and epsilon > 0.0, f"epsilon must be > 0, got {epsilon!r}")
    _require(
        math.isfinite(total_load) and total_load >= 0.0,
        f"total_load must be finite and >= 0, got {total_load!r}",
    )
    return math.ceil((1.0 + epsilon) * total_load / bins)


def within_bounded_load(load: float, incoming: float, capacity: float) -> bool:
    """Whether a candidate at ``load`` can take ``incoming`` more without passing ``capacity``."""
    return load + incoming <= capacity
