"""The simulated requests: a trace's sizes and prefixes, at a target rate, with a
client place and tenant per session (:mod:`fleetsim.geography`). Built once and fed
identically to every policy."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from fleetsim.geography import Geography, Place
from fleetsim.traces import MOONCAKE_BLOCK_TOKENS, Trace
from gtm.gpu_profiles import get_profile, saturated_tokens_per_s
from gtm.models import GeoPoint, Region

#: Longest request replayed (prompt + output tokens): fits every example GPU's KV cache.
MAX_INPUT = 32_768
#: Repeated passes over a trace get disjoint prefix ids (a new user population).
_REPEAT_STRIDE = 1 << 40


@dataclass(frozen=True, slots=True)
class SimRequest:
    at_s: float
    input_tokens: int
    output_tokens: int
    prefix_hashes: tuple[int, ...]
    block_tokens: int
    hash_key: int
    tenant: str
    country: str
    point: GeoPoint
    place_id: int


def fleet_capacity_rps(
    gpu_types: Sequence[str], model: str, trace: Trace, max_input: int = MAX_INPUT
) -> float:
    """Requests/s the fleet serves kept full of the mean request :func:`build_requests`
    replays (same ``max_input`` cut; no prefix cache)."""
    mean_in, mean_out = _mean_sizes(trace, max_input)
    return fleet_capacity_tps(gpu_types, model, trace, max_input) / (mean_in + mean_out)


def fleet_capacity_tps(
    gpu_types: Sequence[str], model: str, trace: Trace, max_input: int = MAX_INPUT
) -> float:
    """Tokens/s (prompt + output) the fleet serves kept full of that mean request."""
    mean_in, mean_out = _mean_sizes(trace, max_input)
    return sum(saturated_tokens_per_s(get_profile(t, model), mean_in, mean_out) for t in gpu_types)


def _mean_sizes(trace: Trace, max_input: int) -> tuple[int, int]:
    # The requests build_requests keeps: without the same cut, Mooncake's long-context
    # tail (mean prompt 12k tokens over the whole trace, 9k below 32k) would make the
    # capacity, and every load, look ~1.4x larger than what is offered.
    reqs = [r for r in trace.requests if r.input_tokens + r.output_tokens <= max_input]
    if not reqs:
        return 1, 1
    mean_in = max(1, round(sum(r.input_tokens for r in reqs) / len(reqs)))
    mean_out = max(1, round(sum(max(1, r.output_tokens) for r in reqs) / len(reqs)))
    return mean_in, mean_out


def nearest_region_counts(requests: Sequence[SimRequest], regions: Sequence[Region]) -> list[int]:
    """How many requests come from clients nearest to each region (by great circle)."""
    counts = [0] * len(regions)
    nearest: dict[int, int] = {}
    for r in requests:
        k = nearest.get(r.place_id)
        if k is None:
            k = nearest[r.place_id] = min(
                range(len(regions)), key=lambda j: r.point.distance_km(regions[j].location)
            )
        counts[k] += 1
    return counts


def build_requests(
    trace: Trace,
    geography: Geography,
    *,
    rate_rps: float,
    duration_s: float,
    max_input: int = MAX_INPUT,
) -> list[SimRequest]:
    """The trace replayed at ``rate_rps`` for ``duration_s`` (looped with fresh prefix
    ids when it runs out), each request with its session's tenant and place."""
    source = [r for r in trace.requests if r.input_tokens + r.output_tokens <= max_input]
    if not source or rate_rps <= 0:
        return []
    span = max(source[-1].at_s, 1e-9)
    speed = rate_rps / (len(source) / span)
    places: dict[tuple[str, str, float, float], int] = {}
    out: list[SimRequest] = []
    rep = 0
    while True:
        base = rep * span / speed
        for k, r in enumerate(source):
            at = base + r.at_s / speed
            if at >= duration_s:
                return out
            offset = rep * _REPEAT_STRIDE
            hashes = tuple(h + offset for h in r.prefix_hashes)
            # Mooncake's first block is a prompt shared by everyone (id 0): a session
            # (conversation) is keyed by its second block.
            session = hashes[min(1, len(hashes) - 1)] if hashes else (rep << 32) + k
            tenant, place = geography.sample(session, at)
            # Not the name alone: cities of one country may share it (a place's RTTs
            # are kept per id).
            key = (place.city, place.country, place.point.lat, place.point.lon)
            pid = places.setdefault(key, len(places))
            out.append(
                SimRequest(
                    at,
                    r.input_tokens,
                    max(1, r.output_tokens),
                    hashes,
                    MOONCAKE_BLOCK_TOKENS,
                    _hash_key(hashes, k, rep),
                    tenant,
                    place.country,
                    place.point,
                    pid,
                )
            )
        rep += 1


def _hash_key(hashes: tuple[int, ...], k: int, rep: int) -> int:
    # The consistent-hash baseline keys on the prompt's start: the first block.
    seed = f"{hashes[0]}" if hashes else f"{rep}:{k}"
    return int.from_bytes(hashlib.md5(seed.encode(), usedforsecurity=False).digest(), "big")


__all__ = [
    "Place",
    "SimRequest",
    "build_requests",
    "fleet_capacity_rps",
    "fleet_capacity_tps",
    "nearest_region_counts",
]
