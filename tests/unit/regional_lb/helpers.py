"""Shared test helpers for the regional LB: tenants, a store that can fail like an outage."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from gtm.models import ModelLoad, RegionSummary, RouteRequest, ZoneSummary
from gtm.testing.outage import OutageStore
from policies.documents import Quotas, RegionalShare, Tenant
from regional_lb.view import PeerInfo, RegionalView, ViewSettings, ZoneInfo


def quotas(**limits: float) -> Quotas:
    return Quotas.model_validate(limits)


def tenant(
    tenant_id: str = "t1",
    *,
    shares: Mapping[str, float] | None = None,
    limits: Mapping[str, float] | None = None,
) -> Tenant:
    return Tenant(
        id=tenant_id,
        quotas=Quotas.model_validate(dict(limits or {})),
        regional_shares=tuple(RegionalShare(region=r, share=s) for r, s in (shares or {}).items()),
    )


#: The outage-switchable store, shipped in gtm.testing (the name these tests know it by).
FlakyStore = OutageStore


# ---------------------------------------------------------------------------- views

MODEL = "m"
NOW = 1_000.0


def model_load(
    *,
    gpus: int = 2,
    healthy: int | None = None,
    running: int = 0,
    waiting: int = 0,
    max_running: int = 16,
    queued: int = 0,
    rate: float = 10_000.0,
    kv: tuple[int, int] = (0, 0),
    model: str = MODEL,
) -> ModelLoad:
    return ModelLoad(
        model=model,
        gpus=gpus,
        healthy_gpus=gpus if healthy is None else healthy,
        prefill_tokens_per_s=rate,
        queued_prefill_tokens=queued,
        running_requests=running,
        waiting_requests=waiting,
        max_running_requests=max_running,
        kv_blocks_total=kv[0],
        kv_blocks_free=kv[1],
    )


def zone(
    zone_id: str,
    *loads: ModelLoad,
    region: str = "r1",
    healthy: bool = True,
    drained: bool = False,
    sketch: tuple[int, ...] = (),
    rtt: float = 2.0,
    summary: bool = True,
) -> ZoneInfo:
    record = ZoneSummary(
        zone_id=zone_id,
        region_id=region,
        published_at=NOW,
        healthy=healthy,
        models=loads or (model_load(),),
        prefix_sketch=sketch,
    )
    return ZoneInfo(
        zone_id,
        record if summary else None,
        drained,
        f"http://{zone_id}",
        rtt,
        frozenset(sketch) if summary else frozenset(),
        None if summary else record,
    )


def peer(
    region_id: str,
    *loads: ModelLoad,
    rtt: float = 50.0,
    drained: bool = False,
    url: str | None = "auto",
    summary: bool = True,
    **fields: Any,
) -> PeerInfo:
    record = (
        RegionSummary(
            region_id=region_id,
            published_at=NOW,
            models=loads or (model_load(),),
            **fields,
        )
        if summary
        else None
    )
    address = f"http://{region_id}" if url == "auto" else url
    return PeerInfo(region_id, record, drained, address, rtt)


def view(
    zones: list[ZoneInfo] | None = None,
    peers: list[PeerInfo] | None = None,
    *,
    region: str = "r1",
    drained: bool = False,
    settings: ViewSettings | None = None,
) -> RegionalView:
    return RegionalView(
        region=region,
        snapshot_revision=1,
        policy=None,
        zones=MappingProxyType({z.id: z for z in zones or []}),
        peers=MappingProxyType({p.id: p for p in peers or []}),
        region_drained=drained,
        settings=settings or ViewSettings(),
    )


def route_request(
    request_id: str = "req-1", *, tokens: int = 1000, prefix: tuple[int, ...] = ()
) -> RouteRequest:
    return RouteRequest(
        request_id=request_id, model=MODEL, input_tokens=tokens, tenant="t1", prefix_hashes=prefix
    )
