"""Per-policy figures from a run: latency percentiles, goodput at SLO, utilisation,
prefix hits, cross-region share, refusals, residency violations, fairness, cost.

Every rate is over the arrival window (``RunResult.window_s``), counting the requests
that arrived in it wherever they finished. TTFT percentiles are over every request that
was not refused: one that never got a first token (client timeout, regional queue TTL,
GPU crash, cut off at the horizon) counts as infinitely late, so a policy cannot look
fast by timing its slow requests out — a percentile (nearest rank, :mod:`gtm.stats`)
that lands on one prints as "timeout". GPU busy is the fraction of the window a GPU had
at least one request in prefill or decode — with a memory-bound decode, a GPU holding
one request is as "busy" as one holding fifty, so spreading policies look busy at any
load; *capacity used* is the utilisation that matters: tokens served per second ÷ the
fleet's saturated token rate. Cross-region: served outside the region nearest the client.
Fairness: Jain's index over the tenants of the share of each tenant's demand, in VTC
service units (input + 2 × output tokens), that was served within the SLO.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fleetsim.results import RunResult, Status
from fleetsim.workload import SimRequest
from gtm.slo import TPOT_SLO_MS, TTFT_SLO_MS
from gtm.stats import percentile_of_sorted
from regional_lb.fairqueue import OUTPUT_WEIGHT as VTC_OUTPUT_WEIGHT

#: SLO of the goodput figure (issue 10, :mod:`gtm.slo`): TTFT ≤ 2 s and TPOT ≤ 100 ms.
SLO_TTFT_S = TTFT_SLO_MS / 1000.0
SLO_TPOT_S = TPOT_SLO_MS / 1000.0
#: On-demand $/GPU-hour (assumption: typical 2025 cloud list prices per GPU; a 70B
#: worker of N GPUs pays N×).
GPU_PRICE_PER_H = {
    "H200": 4.5, "H100": 3.5, "A100-80GB": 2.5, "A100-40GB": 2.0,
    "L40S": 1.5, "L4": 0.8, "V100": 1.0,
}  # fmt: skip
#: Inter-region egress, $/GB (assumption: Azure's published intra-continent rate).
EGRESS_PER_GB = 0.02
#: Bytes per token crossing regions (prompt text in, tokens out): ~4 bytes of text.
BYTES_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class Summary:
    policy: str
    requests: int
    served: int
    refused: int
    timed_out: int
    failed: int
    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    tpot_p50: float
    e2e_p50: float
    e2e_p99: float
    goodput_rps: float
    slo_fraction: float
    output_tps: float
    input_tps: float
    gpu_busy: float
    #: Prompt + output tokens served per second ÷ what the fleet serves kept full of
    #: the trace's mean request (NaN when not given). Prefix-cache hits can push it
    #: past 100 %.
    capacity_used: float
    prefix_hit: float
    cross_region: float
    cross_region_gb: float
    spills: int
    violations: int
    jain: float
    cost_usd: float
    sim_rps: float


def jain(values: np.ndarray) -> float:
    if len(values) == 0 or not np.any(values):
        return 1.0
    return float(values.sum() ** 2 / (len(values) * (values**2).sum()))


def summarise(
    result: RunResult, requests: list[SimRequest], capacity_tps: float | None = None
) -> Summary:
    o = result.outcomes
    ok = o.status == Status.OK
    outs = np.array([r.output_tokens for r in requests], dtype=np.float64)
    ins = np.array([r.input_tokens for r in requests], dtype=np.float64)
    ttft, e2e = o.ttft_s[ok], o.e2e_s[ok]
    tpot = np.where(outs[ok] > 1, (e2e - ttft) / np.maximum(1, outs[ok] - 1), 0.0)
    good = (ttft <= SLO_TTFT_S) & (tpot <= SLO_TPOT_S)
    span = max(result.window_s, 1e-9)
    # Not refused: served, or waited and never got an answer (infinitely late).
    asked = o.status != Status.REFUSED
    ttft_all = np.where(ok, o.ttft_s, np.inf)[asked]
    met = np.zeros(len(requests), dtype=np.bool_)
    met[np.flatnonzero(ok)[good]] = True
    share = tenant_service_share(requests, met)
    cross = ok & (o.region >= 0) & (o.home >= 0) & (o.region != o.home)
    cross_gb = float(((ins + outs)[cross]).sum()) * BYTES_PER_TOKEN / 1e9
    gpu_h = sum(GPU_PRICE_PER_H.get(t, 2.0) for t in result.gpu_types) * span / 3600.0

    # Sorted once per figure: numpy sorts, gtm.stats reads the rank (inf included).
    ttft_sorted, tpot_sorted, e2e_sorted = (np.sort(a).tolist() for a in (ttft_all, tpot, e2e))

    return Summary(
        policy=result.policy,
        requests=len(requests),
        served=int(ok.sum()),
        refused=int((o.status == Status.REFUSED).sum()),
        timed_out=int((o.status == Status.TIMED_OUT).sum()),
        failed=int((o.status == Status.FAILED).sum()),
        ttft_p50=percentile_of_sorted(ttft_sorted, 0.50),
        ttft_p90=percentile_of_sorted(ttft_sorted, 0.90),
        ttft_p99=percentile_of_sorted(ttft_sorted, 0.99),
        tpot_p50=percentile_of_sorted(tpot_sorted, 0.50),
        e2e_p50=percentile_of_sorted(e2e_sorted, 0.50),
        e2e_p99=percentile_of_sorted(e2e_sorted, 0.99),
        goodput_rps=float(good.sum()) / span,
        slo_fraction=float(good.sum()) / max(1, len(requests)),
        output_tps=float(outs[ok].sum()) / span,
        input_tps=float(ins[ok].sum()) / span,
        gpu_busy=float(result.gpu_busy_window_s.sum()) / (len(result.gpu_busy_window_s) * span),
        capacity_used=(
            float((ins + outs)[ok].sum()) / span / capacity_tps if capacity_tps else float("nan")
        ),
        prefix_hit=result.prefix_hit_tokens / max(1, result.prefix_queried_tokens),
        cross_region=float(cross.sum()) / max(1, int(ok.sum())),
        cross_region_gb=cross_gb,
        spills=result.spills,
        violations=int(o.violation.sum()),
        jain=jain(share),
        cost_usd=gpu_h + cross_gb * EGRESS_PER_GB,
        sim_rps=len(requests) / max(result.wall_s, 1e-9),
    )


def tenant_service_share(requests: list[SimRequest], met: np.ndarray) -> np.ndarray:
    """Per tenant (sorted by id): VTC units served within the SLO / VTC units asked."""
    tenants = sorted({r.tenant for r in requests})
    index = {t: k for k, t in enumerate(tenants)}
    tenant_of = np.array([index[r.tenant] for r in requests], dtype=np.int64)
    units = np.array([r.input_tokens + VTC_OUTPUT_WEIGHT * r.output_tokens for r in requests])
    asked = np.bincount(tenant_of, weights=units, minlength=len(tenants))
    served = np.bincount(tenant_of[met], weights=units[met], minlength=len(tenants))
    return np.asarray(served / np.maximum(asked, 1e-9), dtype=np.float64)
