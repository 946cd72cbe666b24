"""The live status page of a local deployment: ``/status`` and ``/api/v1/fleet``.

Two sources, read the same way in one process or many:

* the **state store**, through a :class:`~gtm.state.snapshot.SnapshotWatcher`: regions,
  zones, GPU records, zone and region summaries, drains;
* the **metrics** of the front door and of every regional LB, scraped over HTTP every
  second: requests forwarded per region, spills per (region → peer), refusals by
  reason. Counters become rates (between two scrapes) and "recent" counts (over the
  last :data:`RECENT_WINDOW_S`).

:func:`fleet_document` turns one snapshot and one window of counters into the JSON of
``/api/v1/fleet`` (pure, unit-tested); :class:`StatusPage` does the I/O and serves the
page (``static/status.html``, with the world map of :mod:`gtmctl.up.worldmap` inlined).

``POST``/``DELETE /api/v1/drains/{region|zone|gpu}/{id}`` drain and undrain through the
deployment's own store — the way to drain the embedded (in-memory) store, which no
other process can reach. A drain of an id the store does not know is a 404 naming the
known ones (``?force=1`` drains it anyway; :mod:`gtm.drains`). They are admin APIs
(:mod:`gtm.admin_auth`): ``gtm up`` requires an operator bearer token (it creates one on
first run); without a guard only loopback clients may use them. Every call is audited.
Answers carry ``was``: the drain record in force before (``null``: none), so the
caller can say what it changed and how to undo it.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import json
import logging
import ssl
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from gtm.admin_auth import (
    LOOPBACK_PRINCIPAL,
    PRINCIPAL_KEY,
    AdminGuard,
    admin_middleware,
    path_prefix,
)
from gtm.clock import Clock
from gtm.drains import known_ids, unknown_message
from gtm.errors import StateError
from gtm.metrics import new_registry
from gtm.models import Drain, DrainTarget, ModelLoad, RegionSummary, ZoneSummary
from gtm.state import codec, keys
from gtm.state.snapshot import FleetSnapshot, SnapshotWatcher
from gtm.state.store import KeyValue, StateStore
from gtm.tasks import TaskSupervisor
from gtm.tls import connector_ssl
from gtm.topology import Deployment, RegionPlacement, ZonePlacement
from gtmctl.up.tls import https

log = logging.getLogger(__name__)

#: How often metrics are scraped and the document rebuilt, s.
COLLECT_INTERVAL_S = 1.0
#: Rates (requests, spills) are averaged over this long: one-second rates of a bursty
#: trace flicker too much to read.
RATE_WINDOW_S = 5.0
#: "Recent" refusals are those of the last minute.
RECENT_WINDOW_S = 60.0
#: A region this busy (share of its running-sequence capacity) shows as saturated. The
#: regional LB's own saturation threshold for spilling is in the same range.
SATURATED_AT = 0.9
SCRAPE_TIMEOUT_S = 2.0

#: Counters read from the tiers' /metrics (sample names, with _total).
FORWARDS = "gtm_global_forward_attempts_total"
GLOBAL_REFUSALS = "gtm_global_refusals_total"
SPILLS = "gtm_regional_spills_total"
REGIONAL_REJECTIONS = "gtm_regional_rejected_total"
COUNTERS = frozenset({FORWARDS, GLOBAL_REFUSALS, SPILLS, REGIONAL_REJECTIONS})

#: (sample name, sorted label pairs) → value; the source of a sample is a label too.
CounterKey = tuple[str, tuple[tuple[str, str], ...]]


def parse_counters(text: str, source: str) -> dict[CounterKey, float]:
    """The counters of interest in a Prometheus text exposition, labelled by source."""
    found: dict[CounterKey, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in COUNTERS:
                labels = tuple(sorted({**sample.labels, "source": source}.items()))
                found[(sample.name, labels)] = float(sample.value)
    return found


@dataclass(slots=True)
class CounterWindow:
    """Counter readings over time: rates since the previous reading, totals over the
    recent window. Counters that went down (a restarted process) restart from zero."""

    keep_s: float = RECENT_WINDOW_S
    readings: deque[tuple[float, dict[CounterKey, float]]] = field(default_factory=deque)

    def add(self, at: float, counters: dict[CounterKey, float]) -> None:
        self.readings.append((at, counters))
        while len(self.readings) > 2 and at - self.readings[1][0] >= self.keep_s:
            self.readings.popleft()

    def _delta(self, older: int) -> tuple[float, dict[CounterKey, float]]:
        if len(self.readings) < 2:
            return 0.0, {}
        t0, before = self.readings[min(older, len(self.readings) - 2)]
        t1, after = self.readings[-1]
        deltas = {}
        for key, value in after.items():
            previous = before.get(key, 0.0)
            deltas[key] = value - previous if value >= previous else value
        return t1 - t0, deltas

    def rates(self, over_s: float = RATE_WINDOW_S) -> dict[CounterKey, float]:
        """Per second, over the last ``over_s`` seconds (or what the readings span)."""
        if len(self.readings) < 2:
            return {}
        latest = self.readings[-1][0]
        older = next(
            (
                i
                for i in range(len(self.readings) - 2, -1, -1)
                if latest - self.readings[i][0] >= over_s
            ),
            0,
        )
        span, deltas = self._delta(older)
        return {k: v / span for k, v in deltas.items()} if span > 0 else {}

    def recent(self) -> tuple[float, dict[CounterKey, float]]:
        """Increases over the window (its actual span, s)."""
        return self._delta(0)


def _label(key: CounterKey, name: str) -> str:
    return dict(key[1]).get(name, "")


# ---------------------------------------------------------------------------- the document


def _model_row(load: ModelLoad) -> dict[str, Any]:
    delay = load.queue_delay_ms()
    return {
        "model": load.model,
        "gpus": load.gpus,
        "healthy_gpus": load.healthy_gpus,
        "utilisation": round(load.utilisation, 3),
        "running": load.running_requests,
        "waiting": load.waiting_requests,
        "queue_delay_ms": None if delay == float("inf") else round(delay, 1),
    }


def _zone_utilisation(summary: ZoneSummary | None) -> float | None:
    if summary is None or not summary.models:
        return None
    running = sum(m.running_requests for m in summary.models)
    capacity = sum(m.max_running_requests for m in summary.models)
    return round(min(1.0, running / capacity), 3) if capacity else 1.0


def _zone(zone: ZonePlacement, snapshot: FleetSnapshot) -> dict[str, Any]:
    summary = snapshot.zone_summaries.get(zone.id)
    records = {g.id: g for g in snapshot.gpus_by_zone.get(zone.id, ())}
    gpus = []
    for gpu in zone.gpus:
        record = records.get(gpu.id)
        gpus.append(
            {
                "id": gpu.id,
                "type": gpu.gpu_type,
                "models": list(gpu.models),
                "state": record.state.value if record is not None else "missing",
                "drained": snapshot.is_drained(DrainTarget.GPU, gpu.id),
            }
        )
    return {
        "id": zone.id,
        "url": zone.url,
        "healthy": summary is not None and summary.healthy,
        "drained": snapshot.is_drained(DrainTarget.ZONE, zone.id),
        "utilisation": _zone_utilisation(summary),
        "waiting": sum(m.waiting_requests for m in summary.models) if summary else 0,
        "running": sum(m.running_requests for m in summary.models) if summary else 0,
        "gpus": gpus,
        "models": [_model_row(m) for m in summary.models] if summary else [],
    }


def region_status(
    region_id: str, summary: RegionSummary | None, snapshot: FleetSnapshot, zones: int
) -> str:
    """drained, down, degraded, saturated or healthy — what colours the map."""
    if snapshot.is_drained(DrainTarget.REGION, region_id):
        return "drained"
    if summary is None or not summary.healthy or (zones and summary.zones_healthy == 0):
        return "down"
    if summary.zones_healthy < max(zones, summary.zones_total):
        return "degraded"
    if summary.saturation >= SATURATED_AT:
        return "saturated"
    return "healthy"


def _region(
    placement: RegionPlacement, snapshot: FleetSnapshot, requests_per_s: float
) -> dict[str, Any]:
    record = placement.region
    summary = snapshot.region_summaries.get(record.id)
    return {
        "id": record.id,
        "name": record.name,
        "lat": record.location.lat,
        "lon": record.location.lon,
        "country": record.country,
        "jurisdiction": record.jurisdiction,
        "url": placement.url,
        "address": placement.host,
        "status": region_status(record.id, summary, snapshot, len(placement.zones)),
        "saturation": round(summary.saturation, 3) if summary else None,
        "zones_total": len(placement.zones),
        "zones_healthy": summary.zones_healthy if summary else 0,
        "requests_per_s": round(requests_per_s, 2),
        "spill_in_per_s": round(summary.spill_in_per_s, 2) if summary else 0.0,
        "spill_out_per_s": round(summary.spill_out_per_s, 2) if summary else 0.0,
        "predicted_ttft_ms": (
            {t.model: round(t.ttft_ms, 1) for t in summary.predicted_ttft} if summary else {}
        ),
        "zones": [_zone(z, snapshot) for z in placement.zones],
    }


def _flows(rates: Mapping[CounterKey, float]) -> list[dict[str, Any]]:
    pairs: dict[tuple[str, str], float] = {}
    for key, rate in rates.items():
        if key[0] == SPILLS and rate > 0:
            origin = _label(key, "source").removeprefix("regional:")
            pair = (origin, _label(key, "peer"))
            pairs[pair] = pairs.get(pair, 0.0) + rate
    return [{"from": a, "to": b, "per_s": round(r, 2)} for (a, b), r in sorted(pairs.items())]


def _refusals(recent: Mapping[CounterKey, float]) -> dict[str, float]:
    by_reason: dict[str, float] = {}
    for key, count in recent.items():
        if count <= 0:
            continue
        if key[0] == GLOBAL_REFUSALS:
            reason = f"global/{_label(key, 'channel')}: {_label(key, 'reason')}"
        elif key[0] == REGIONAL_REJECTIONS:
            reason = f"regional: {_label(key, 'reason')}"
        else:
            continue
        by_reason[reason] = by_reason.get(reason, 0.0) + count
    return dict(sorted(by_reason.items(), key=lambda kv: -kv[1]))


def _forwarded(rates: Mapping[CounterKey, float]) -> dict[str, float]:
    per_region: dict[str, float] = {}
    for key, rate in rates.items():
        result = _label(key, "result")
        # "ok" and "http-NNN" reached the region; connect errors and missing endpoints
        # did not (the front door retried elsewhere).
        if key[0] == FORWARDS and (result == "ok" or result.startswith("http-")):
            region = _label(key, "region")
            per_region[region] = per_region.get(region, 0.0) + rate
    return per_region


def fleet_document(
    deployment: Deployment,
    snapshot: FleetSnapshot,
    window: CounterWindow,
    *,
    now: float,
    stale: bool = False,
) -> dict[str, Any]:
    """The ``/api/v1/fleet`` document."""
    rates = window.rates()
    span, recent = window.recent()
    forwarded = _forwarded(rates)
    regions = [_region(r, snapshot, forwarded.get(r.id, 0.0)) for r in deployment.regions]
    gpus = [g for r in regions for z in r["zones"] for g in z["gpus"]]
    return {
        "generated_at": now,
        "revision": snapshot.revision,
        "stale": stale,
        "regions": regions,
        "undeployed": list(deployment.undeployed),
        "flows": _flows(rates),
        "refusals": {"window_s": round(span, 1), "by_reason": _refusals(recent)},
        "totals": {
            "regions": len(regions),
            "zones": sum(len(r["zones"]) for r in regions),
            "gpus": len(gpus),
            "gpus_ready": sum(1 for g in gpus if g["state"] == "ready" and not g["drained"]),
            "requests_per_s": round(sum(forwarded.values()), 2),
        },
        "drains": sorted(snapshot.drains),
    }


# ---------------------------------------------------------------------------- serving


def page_html() -> str:
    """The status page with the world map inlined (one request, no external assets)."""
    static = resources.files("gtmctl.up") / "static"
    world = json.loads((static / "world.json").read_text("utf-8"))
    html = (static / "status.html").read_text("utf-8")
    return html.replace("{{WORLD_PATH}}", world["path"])


class StatusPage:
    """Routes on an aiohttp app (:meth:`install`), fed once :meth:`attach`-ed to a
    running deployment; :meth:`aclose` stops its loops."""

    #: The admin routes: guarded and audited by :attr:`guard`.
    ADMIN_PREFIX = "/api/v1/drains/"

    def __init__(
        self, deployment: Deployment, *, clock: Clock, guard: AdminGuard | None = None
    ) -> None:
        self._deployment = deployment
        self._clock = clock
        self.guard = guard if guard is not None else AdminGuard(tokens=None, clock=clock)
        self._registry = new_registry()
        self._supervisor = TaskSupervisor(registry=self._registry, clock=clock, component="status")
        self._html = page_html()
        self._store: StateStore | None = None
        self._watcher: SnapshotWatcher | None = None
        self._sources: dict[str, str] = {}
        self._session: aiohttp.ClientSession | None = None
        self.window = CounterWindow()
        self._document: dict[str, Any] | None = None

    def install(self, app: web.Application) -> None:
        app.middlewares.append(admin_middleware(self.guard, path_prefix(self.ADMIN_PREFIX)))
        app.router.add_get("/status", self._page)
        app.router.add_get("/status/", self._page)
        app.router.add_get("/api/v1/fleet", self._fleet)
        app.router.add_post("/api/v1/drains/{target}/{id}", self._drain)
        app.router.add_delete("/api/v1/drains/{target}/{id}", self._undrain)

    async def attach(
        self, store: StateStore, *, front_door: str, tls: ssl.SSLContext | None = None
    ) -> None:
        """Start following ``store`` and scraping the front door and regional LBs (over
        mutual TLS with ``tls``, gtm up's ``ops`` identity, under ``gtm up --tls``)."""
        self._store = store
        self._watcher = SnapshotWatcher(
            store, clock=self._clock, registry=self._registry, component="status"
        )
        self._sources = {"global": f"{front_door}/metrics"} | {
            f"regional:{r.id}": f"{https(r.url) if tls else r.url}/metrics"
            for r in self._deployment.regions
        }
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_S),
            connector=aiohttp.TCPConnector(ssl=connector_ssl(tls)),
        )
        self._supervisor.spawn("snapshot", self._watcher.run())
        await self._watcher.wait_ready()
        await self.collect()
        self._supervisor.run_loop("collect", self.collect, interval=COLLECT_INTERVAL_S)

    async def aclose(self) -> None:
        await self._supervisor.aclose()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------------ collecting

    async def _scrape(self, source: str, url: str) -> dict[CounterKey, float]:
        assert self._session is not None
        try:
            async with self._session.get(url) as response:
                if response.status != 200:
                    return {}
                return parse_counters(await response.text(), source)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return {}  # a tier that is down shows as down through the store

    async def collect(self) -> None:
        scraped = await asyncio.gather(*(self._scrape(s, u) for s, u in self._sources.items()))
        counters: dict[CounterKey, float] = {}
        for part in scraped:
            counters.update(part)
        self.window.add(self._clock.monotonic(), counters)
        assert self._watcher is not None
        self._document = fleet_document(
            self._deployment,
            self._watcher.current,
            self.window,
            now=self._clock.wall(),
            stale=self._watcher.stale,
        )

    # ------------------------------------------------------------------ handlers

    async def _page(self, request: web.Request) -> web.Response:
        return web.Response(text=self._html, content_type="text/html", charset="utf-8")

    async def _fleet(self, request: web.Request) -> web.Response:
        if self._document is None:
            return web.json_response({"error": "starting"}, status=503)
        return web.json_response(self._document, headers={"Cache-Control": "no-store"})

    def _drain_key(self, request: web.Request) -> tuple[DrainTarget, str, str] | web.Response:
        if self._store is None:
            return web.json_response({"error": "starting"}, status=503)
        target_text, target_id = request.match_info["target"], request.match_info["id"]
        try:
            target = DrainTarget(target_text)
            key = keys.drain(target, target_id)
        except ValueError:
            return web.json_response(
                {
                    "error": f"expected /api/v1/drains/{{region|zone|gpu}}/{{id}}, got "
                    f"{target_text!r}/{target_id!r}"
                },
                status=400,
            )
        return target, target_id, key

    async def _drain(self, request: web.Request) -> web.Response:
        parsed = self._drain_key(request)
        if isinstance(parsed, web.Response):
            return parsed
        target, target_id, key = parsed
        assert self._store is not None
        if request.query.get("force") not in ("1", "true"):
            try:
                known = await known_ids(self._store, target)
            except StateError as exc:
                return web.json_response({"error": str(exc)}, status=503)
            if target_id not in known:
                return web.json_response(
                    {"error": unknown_message(target, target_id, known), "known": list(known)},
                    status=404,
                )
        by = "gtm up"
        principal = request.get(PRINCIPAL_KEY)
        if principal is not None and principal.who != LOOPBACK_PRINCIPAL:
            by = f"admin-token:{principal.who}"
        else:
            with contextlib.suppress(KeyError, OSError):
                by = getpass.getuser()
        record = Drain(target=target, id=target_id, reason="status page", by=by, at=time.time())
        try:
            was = await self._store.get(key)
            revision = await self._store.put(key, codec.encode(record))
        except StateError as exc:
            return web.json_response({"error": str(exc)}, status=503)
        return web.json_response(
            {"drained": f"{target.value}/{target_id}", "revision": revision, "was": _json(was)}
        )

    async def _undrain(self, request: web.Request) -> web.Response:
        parsed = self._drain_key(request)
        if isinstance(parsed, web.Response):
            return parsed
        target, target_id, key = parsed
        assert self._store is not None
        try:
            was = await self._store.get(key)
            existed = await self._store.delete(key)
        except StateError as exc:
            return web.json_response({"error": str(exc)}, status=503)
        return web.json_response(
            {"undrained": f"{target.value}/{target_id}", "existed": existed, "was": _json(was)}
        )


def _json(kv: KeyValue | None) -> Any:
    """A stored drain record as JSON (``was`` in the drain API's answers: the drain in
    force before, so ``gtm drain``/``gtm undrain --api`` can print the undo); ``None``
    when there was none or it cannot be read."""
    if kv is None:
        return None
    try:
        return json.loads(kv.value)
    except ValueError:
        return None
