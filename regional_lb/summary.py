"""The region summary the global tier (and peer regional LBs) route on, under a lease.

:func:`build_summary` is pure: the view (zone summaries), this replica's in-flight
corrections and its spill rates in, a :class:`gtm.models.RegionSummary` out. Per model,
over the region's non-drained zones:

* capacity and load are the zones' sums (``ModelLoad``), healthy GPUs and prefill rate
  counting healthy zones only, with what this replica sent since each zone's summary
  added to the queue (as zone choice sees it); ``classes``, the healthy zones' GPU
  classes summed per class, after what was sent since took their free GPUs (fastest
  first), so the global tier prices the region by the GPU that would take a request
  (:func:`gtm.routing.cost.prefill_options`);
* ``predicted_ttft`` is the best zone's intra-region RTT + queueing delay (none when a
  GPU there is free), i.e. the TTFT of a request with nothing to prefill (each caller
  adds its RTT and own prefill);
* ``saturated_models`` lists the models no zone can take more of, ``saturation`` is the
  share of the region's request capacity in use;
* ``spill_in_per_s`` / ``spill_out_per_s`` are this replica's rates over the last
  :attr:`RateMeter.window_s` seconds (peers use ``spill_out`` to avoid ping-pong).

With several replicas per region, each publishes the same key; the last write wins,
and the rates are that replica's view. :class:`gtm.state.publisher.LeasedPublisher` writes
it every interval under a lease of three intervals, so a dead regional LB's summary
disappears by itself.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from gtm.models import (
    Endpoint,
    ModelLoad,
    ModelTtft,
    RegionSummary,
    merge_classes,
    taking_free,
)
from regional_lb.plugins.ttft import zone_options
from regional_lb.view import RegionalView, ZoneAccounting, ZoneState, is_saturated, zone_candidates


class RateMeter:
    """Events per second over a sliding window of whole seconds (sans-io: pass ``now``)."""

    def __init__(self, window_s: int = 10) -> None:
        if window_s < 1:
            raise ValueError("window_s must be >= 1")
        self.window_s = window_s
        self._buckets: deque[tuple[int, int]] = deque()  # (second, count)

    def add(self, now: float, count: int = 1) -> None:
        second = math.floor(now)
        if self._buckets and self._buckets[-1][0] == second:
            self._buckets[-1] = (second, self._buckets[-1][1] + count)
        else:
            self._buckets.append((second, count))
        self._trim(second)

    def _trim(self, second: int) -> None:
        while self._buckets and self._buckets[0][0] <= second - self.window_s:
            self._buckets.popleft()

    def rate(self, now: float) -> float:
        self._trim(math.floor(now))
        return sum(count for _, count in self._buckets) / self.window_s


def _model_names(view: RegionalView) -> list[str]:
    names = {
        m.model for z in view.zones.values() if z.summary is not None for m in z.summary.models
    }
    return sorted(names)


def _aggregate(model: str, zones: Iterable[ZoneState]) -> ModelLoad:
    serving = [z for z in zones if z.load is not None and not z.drained]
    healthy = [z for z in serving if z.healthy]
    loads = [z.load for z in serving if z.load is not None]
    fresh = [z.load for z in healthy if z.load is not None]
    kv_total = sum(x.kv_blocks_total for x in fresh)
    return ModelLoad(
        model=model,
        gpus=sum(x.gpus for x in loads),
        healthy_gpus=sum(x.healthy_gpus for x in fresh),
        prefill_tokens_per_s=math.fsum(x.prefill_tokens_per_s for x in fresh),
        decode_tokens_per_s=math.fsum(x.decode_tokens_per_s for x in fresh),
        queued_prefill_tokens=sum(z.queued_tokens for z in healthy),
        running_requests=sum(x.running_requests for x in fresh)
        + sum(z.unseen_requests for z in healthy),
        waiting_requests=sum(x.waiting_requests for x in fresh),
        max_running_requests=sum(x.max_running_requests for x in fresh),
        kv_blocks_total=kv_total,
        kv_blocks_free=min(kv_total, sum(x.kv_blocks_free for x in fresh)),
        classes=merge_classes(
            taking_free(z.load.classes, z.unseen_requests) for z in healthy if z.load is not None
        ),
    )


def _best_ttft(zones: Iterable[ZoneState]) -> float | None:
    costs = [
        z.info.rtt_ms + min(option.queue_ms for option in zone_options(z))
        for z in zones
        if z.healthy and not z.drained and z.load is not None
    ]
    return min(costs) if costs else None


def build_summary(
    view: RegionalView,
    accounting: ZoneAccounting | None,
    *,
    published_at: float,
    spill_in_per_s: float = 0.0,
    spill_out_per_s: float = 0.0,
    endpoints: tuple[Endpoint, ...] = (),
) -> RegionSummary:
    """The region's summary from its current view (``published_at``: wall-clock s)."""
    settings = view.settings
    models: list[ModelLoad] = []
    ttfts: list[ModelTtft] = []
    saturated: list[str] = []
    busy = capacity = 0
    for model in _model_names(view):
        zones = zone_candidates(view, model, accounting)
        models.append(_aggregate(model, zones))
        best = _best_ttft(zones)
        if best is not None:
            ttfts.append(ModelTtft(model=model, ttft_ms=best))
        open_zones = [
            z
            for z in zones
            if z.healthy
            and not z.drained
            and z.load is not None
            and not is_saturated(z.load, z.unseen_requests, settings)
        ]
        if not open_zones:
            saturated.append(model)
        for zone in zones:
            if zone.healthy and not zone.drained and zone.load is not None:
                busy += zone.running
                capacity += (
                    zone.load.max_running_requests
                    + settings.queue_depth_per_gpu * zone.load.healthy_gpus
                )
    live = [z for z in view.zones.values() if z.summary is not None and not z.drained]
    healthy_zones = [z for z in live if z.summary is not None and z.summary.healthy]
    return RegionSummary(
        region_id=view.region,
        published_at=published_at,
        healthy=bool(healthy_zones) and not view.region_drained,
        zones_total=len(view.zones),
        zones_healthy=len(healthy_zones),
        models=tuple(models),
        saturation=1.0 if capacity == 0 else min(1.0, busy / capacity),
        saturated_models=tuple(saturated),
        predicted_ttft=tuple(ttfts),
        spill_in_per_s=spill_in_per_s,
        spill_out_per_s=spill_out_per_s,
        endpoints=endpoints,
    )
