"""Spillover to peer regions: which peers may take a request, ranked by cost (sans-io),
and the rate limit on spill decisions.

A peer is a candidate only if it is **inside the residency-allowed set** of the request
(the verdict computed for the request's tenant, data class, client country and model —
never the region's own, broader view) and:

* it is not this region and not a region the request was already spilled from
  (``x-gtm-spilled-from``), and the request has hops left (at most
  :attr:`SpillSettings.max_hops` regional hops: loop prevention);
* it is not drained, has a regional LB endpoint and a fresh region summary that says it
  is healthy and serves the model with healthy GPUs;
* it is not saturated for the model and is not spilling out itself
  (``spill_out_per_s`` in its summary): two full regions must not bounce requests
  between them (no ping-pong).

Cost = inter-region RTT (measured Azure P50s, :mod:`regional_lb.rtt`) + the peer's
predicted TTFT for the request: its published queueing TTFT for the model plus the
request's own prefill on one of its GPUs. Ties go to the smaller region id.

:class:`SpillLimiter` caps spill decisions per peer (a token bucket each), so a burst
of saturation moves a bounded stream of requests, not the whole region's traffic at
once, and a peer's summary has time to reflect what it received.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from gtm.models import RegionSummary, RouteRequest
from regional_lb.buckets import TokenBucket
from regional_lb.plugins.ttft import peer_terms, prefill_ms
from regional_lb.view import PeerInfo, PeerStatic, RegionalView

#: ARCHITECTURE §6 allows retries "with loop prevention across tiers"; two regional
#: hops (the region the global tier chose, then one spill) bound every path.
MAX_HOPS = 2


@dataclass(frozen=True, slots=True)
class SpillSettings:
    max_hops: int = MAX_HOPS
    #: Spill decisions per second to one peer, and the burst (a token bucket).
    per_peer_rate: float = 50.0
    per_peer_burst: float = 50.0
    #: Saturation (from the peer's summary) at or above which it takes no spills.
    max_peer_saturation: float = 0.9
    #: A peer spilling out more than this (requests/s) takes no spills (no ping-pong).
    max_peer_spill_out: float = 0.0
    #: Summaries older than this (s) are not trusted for spill decisions.
    max_summary_age_s: float = 10.0


#: No peer is ever offered (out of hops from the start): a single-region balancer
#: (``gtm regional --no-spill``).
NO_SPILL = SpillSettings(max_hops=0)


@dataclass(frozen=True, slots=True)
class PeerOption:
    region: str
    url: str
    rtt_ms: float
    ttft_ms: float

    @property
    def cost_ms(self) -> float:
        return self.rtt_ms + self.ttft_ms


def peer_ttft_ms(summary: RegionSummary, request: RouteRequest) -> float:
    """The peer's predicted TTFT for ``request`` (without the RTT to it)."""
    load = summary.load_for(request.model)
    if load is None or load.healthy_gpus == 0 or load.prefill_tokens_per_s <= 0.0:
        return math.inf
    queueing = summary.ttft_for(request.model)
    if queueing is None:
        queueing = load.queue_delay_ms()
    # The GPUs that would take it (the fastest free class, or the pool): the regional
    # cost's own terms (regional_lb.plugins.ttft.peer_terms), not the average GPU.
    terms = peer_terms(summary, request.model)
    return queueing + prefill_ms(request.input_tokens, terms.gpus, terms.prefill_tokens_per_s)


def why_not(
    peer: PeerInfo,
    request: RouteRequest,
    *,
    allowed: frozenset[str],
    excluded: frozenset[str],
    now_wall: float,
    settings: SpillSettings,
) -> str | None:
    """Why ``peer`` cannot take ``request`` (``None``: it can). Residency first."""
    if peer.id not in allowed:
        return "not allowed by residency"
    if peer.id in excluded:
        return "already on the request's path"
    if peer.drained:
        return "drained"
    if peer.url is None:
        return "no regional LB endpoint"
    summary = peer.summary
    if summary is None:
        return "no region summary"
    if now_wall - summary.published_at > settings.max_summary_age_s:
        return "region summary is stale"
    if not summary.healthy:
        return "unhealthy"
    load = summary.load_for(request.model)
    if load is None or load.healthy_gpus == 0:
        return f"does not serve {request.model}"
    if (
        request.model in summary.saturated_models
        or summary.saturation >= settings.max_peer_saturation
    ):
        return "saturated"
    if summary.spill_out_per_s > settings.max_peer_spill_out:
        return "spilling out itself"
    return None


def spill_options(
    view: RegionalView,
    request: RouteRequest,
    *,
    allowed: frozenset[str],
    spilled_from: Iterable[str] = (),
    hops: int,
    now_wall: float,
    settings: SpillSettings,
) -> tuple[PeerOption, ...]:
    """The peers that may take ``request``, cheapest first (empty when out of hops)."""
    if hops >= settings.max_hops:
        return ()
    model = request.model
    statics = view.memo.peers.get((model, settings))
    if statics is None:
        statics = view.memo.peers[(model, settings)] = _peer_statics(view, model, settings)
    # The request-dependent rest of why_not (residency, path, summary age), then
    # peer_ttft_ms with the summary's part (its queueing) worked out once per view.
    excluded = frozenset((view.region, *spilled_from))
    tokens = request.input_tokens
    options: list[PeerOption] = []
    for p in statics:
        peer = p.info
        if peer.id not in allowed or peer.id in excluded:
            continue
        if now_wall - p.summary.published_at > settings.max_summary_age_s:
            continue
        ttft = p.queueing_ms + prefill_ms(tokens, p.healthy_gpus, p.prefill_tokens_per_s)
        if math.isfinite(ttft):
            options.append(PeerOption(peer.id, p.url, peer.rtt_ms, ttft))
    options.sort(key=lambda o: (o.cost_ms, o.region))
    return tuple(options)


def _peer_statics(
    view: RegionalView, model: str, settings: SpillSettings
) -> tuple[PeerStatic, ...]:
    """The peers of ``view`` that pass :func:`why_not`'s request-independent checks for
    ``model`` and have a finite prefill rate (:func:`peer_ttft_ms` is inf otherwise)."""
    out: list[PeerStatic] = []
    for peer in view.peers.values():
        summary = peer.summary
        if peer.drained or peer.url is None or summary is None or not summary.healthy:
            continue
        load = summary.load_for(model)
        if load is None or load.healthy_gpus == 0 or load.prefill_tokens_per_s <= 0.0:
            continue
        if model in summary.saturated_models or summary.saturation >= settings.max_peer_saturation:
            continue
        if summary.spill_out_per_s > settings.max_peer_spill_out:
            continue
        queueing = summary.ttft_for(model)
        if queueing is None:
            queueing = load.queue_delay_ms()
        terms = peer_terms(summary, model)  # as peer_ttft_ms prices it
        out.append(
            PeerStatic(peer, summary, peer.url, terms.gpus, terms.prefill_tokens_per_s, queueing)
        )
    return tuple(out)


class SpillLimiter:
    """A token bucket per peer: spill decisions a second (sans-io: pass ``now``)."""

    def __init__(self, settings: SpillSettings | None = None) -> None:
        self._settings = settings or SpillSettings()
        self._buckets: dict[str, TokenBucket] = {}

    def allow(self, peer: str, now: float) -> bool:
        bucket = self._buckets.get(peer)
        if bucket is None:
            settings = self._settings
            bucket = TokenBucket.full(settings.per_peer_rate, settings.per_peer_burst, now)
            self._buckets[peer] = bucket
        if bucket.wait_for(1.0, now) > 0.0:
            return False
        bucket.take(1.0, now)
        return True
