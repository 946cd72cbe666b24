"""The whole global tier on loopback: the OpenAI SDK through the front door to stand-in
regional LBs (test code only) that forward to an emulated GPU worker."""

from __future__ import annotations

import asyncio
import copy
import ipaddress
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import dns.asyncquery
import dns.edns
import dns.message
import openai
import pytest
import yaml
from aiohttp import web
from multidict import CIMultiDict
from openai import AsyncOpenAI
from prometheus_client import Histogram
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from global_lb.app import GlobalConfig, GlobalTier
from global_lb.config import FrontDoorConfig
from global_lb.dns.rrl import RrlConfig
from global_lb.geo import ChainLocator, MaxMindLocator
from global_lb.health import HealthCheckConfig
from global_lb.inflight import Unseen
from global_lb.request import parse_body
from gpusim.server import GpuSimConfig, GpuSimServer
from gtm.clock import SystemClock
from gtm.gpu_profiles import LLAMA_8B
from gtm.metrics import new_registry
from gtm.trust import AuthResult, TierKey
from policies import verify
from policies.audit import iter_records
from tests.unit.global_lb.helpers import REGION_IDS, address_of, topology, write_city_db

pytestmark = pytest.mark.integration

LONDON = "81.2.69.7"
#: The key the front door signs its forwards with in these tests.
TIER_KEY = "front-door-test-key"
STOCKHOLM = "89.160.20.7"


@dataclass
class StandIn:
    """A stand-in for one region's regional LB: forwards to the emulated worker."""

    region: str
    worker_url: str
    runner: web.AppRunner | None = None
    port: int = 0
    seen: list[str] = field(default_factory=list)
    countries: list[str | None] = field(default_factory=list)
    #: When set, answers as a regional LB that spilled the request to this peer region.
    served_by: str | None = None
    #: When set, a request waits for it after setting ``arrived``.
    gate: asyncio.Event | None = None
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    headers: list[CIMultiDict[str]] = field(default_factory=list)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_route("*", "/v1/{tail:.*}", self._forward)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", self.port)
        await site.start()
        self.port = self.runner.addresses[0][1]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(request.headers.get("x-gtm-decision-id", ""))
        self.countries.append(request.headers.get("x-gtm-client-country"))
        self.headers.append(CIMultiDict(request.headers))
        self.arrived.set()
        if self.gate is not None:
            await self.gate.wait()
        async with aiohttp.ClientSession() as session, session.request(
            request.method, self.worker_url + request.path, data=await request.read(),
            headers={"Content-Type": "application/json"},
        ) as upstream:  # fmt: skip
            response = web.StreamResponse(status=upstream.status)
            response.content_type = upstream.content_type
            if self.served_by is not None:
                response.headers["x-gtm-region"] = self.served_by
                response.headers["x-gtm-spilled-from"] = self.region
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response


@dataclass
class Deployment:
    tier: GlobalTier
    stand_ins: dict[str, StandIn]
    http: str
    audit_dir: Path

    def client(self, key: str, client_ip: str = LONDON) -> AsyncOpenAI:
        return AsyncOpenAI(
            base_url=self.http + "/v1",
            api_key=key,
            max_retries=0,
            timeout=20.0,
            default_headers={"X-Forwarded-For": client_ip},
        )


@pytest.fixture
async def deployment(tmp_path: Path) -> AsyncIterator[Deployment]:
    worker = GpuSimServer(
        GpuSimConfig(
            port=0, speedup=1000.0, gpu_type="H100", models=(LLAMA_8B,), seed=1, warmup_passes=0
        ),
        registry=new_registry(),
    )
    await worker.start()
    stand_ins = {r: StandIn(r, worker.url) for r in REGION_IDS}
    for stand_in in stand_ins.values():
        await stand_in.start()
    regions = topology(ports={r: s.port for r, s in stand_ins.items()})
    # The URLs point at the stand-ins on 127.0.0.1; DNS answers keep the 127.0.1.N addresses.
    fixed = [
        r.model_copy(
            update={
                "endpoints": (
                    r.endpoints[0].model_copy(
                        update={"url": f"http://127.0.0.1:{stand_ins[r.id].port}"}
                    ),
                )
            }
        )
        for r in regions
    ]
    topo = tmp_path / "topology.yaml"
    topo.write_text(
        yaml.safe_dump({"regions": [r.model_dump(mode="json", by_alias=True) for r in fixed]})
    )
    config = GlobalConfig(
        dns_listen="127.0.0.1:0",
        http_listen="127.0.0.1:0",
        topology=str(topo),
        audit_dir=str(tmp_path / "audit"),
        rrl=RrlConfig(rate=0),
        # One health round at start; the test drives later rounds itself (check_once).
        health=HealthCheckConfig(interval=3600.0, fall=2, rise=2),
        front_door=FrontDoorConfig(
            trusted_proxies=(ipaddress.ip_network("127.0.0.0/8"),),
            peer_token=SecretStr(TIER_KEY),
        ),
    )
    tier = GlobalTier(
        config,
        clock=SystemClock(),
        registry=new_registry(),
        locator=ChainLocator(MaxMindLocator(write_city_db(tmp_path / "city.mmdb"))),
    )
    endpoints = await tier.start()
    await tier.health.wait_ready()
    assert endpoints.http is not None
    yield Deployment(tier, stand_ins, endpoints.http, tmp_path / "audit")
    await tier.stop()
    for stand_in in stand_ins.values():
        await stand_in.stop()
    await worker.stop()


async def test_chat_completion_end_to_end_with_region_headers(deployment: Deployment) -> None:
    async with deployment.client("gtm-demo-global") as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=LLAMA_8B,
            messages=[{"role": "user", "content": "Hello from London"}],
            max_tokens=8,
        )
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert raw.headers["x-gtm-region"] == "eu-west"
    decision = raw.headers["x-gtm-decision-id"]
    assert deployment.stand_ins["eu-west"].seen == [decision]


async def test_client_country_is_forwarded_and_cannot_be_spoofed(
    deployment: Deployment,
) -> None:
    """The regional LB re-checks residency on spillover with the country the front door
    located; a client's own x-gtm-client-country must not reach it."""
    async with AsyncOpenAI(
        base_url=deployment.http + "/v1",
        api_key="gtm-demo-global",
        max_retries=0,
        timeout=20.0,
        default_headers={"X-Forwarded-For": LONDON, "x-gtm-client-country": "US"},
    ) as client:
        await client.chat.completions.create(
            model=LLAMA_8B, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    assert deployment.stand_ins["eu-west"].countries == ["GB"]


async def test_forwards_are_signed_and_carry_no_client_tier_header(
    deployment: Deployment,
) -> None:
    """Every x-gtm- header a client sends that only a tier may set is dropped; what the
    front door asserts (the client's location and where it came from, the hop count) is
    signed with the tiers' key, so the regional LB can believe it."""
    forged = {
        "x-gtm-spilled-from": "us-east",
        "x-gtm-peer-token": "guess",
        "x-gtm-tier-auth": "v1;global;1;" + "0" * 64,
        "x-gtm-location-source": "signed-upstream",
        "x-gtm-new-thing": "1",
    }
    async with AsyncOpenAI(
        base_url=deployment.http + "/v1",
        api_key="gtm-demo-global",
        max_retries=0,
        timeout=20.0,
        default_headers={"X-Forwarded-For": LONDON, **forged},
    ) as client:
        await client.chat.completions.create(
            model=LLAMA_8B, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    [sent] = deployment.stand_ins["eu-west"].headers
    assert "x-gtm-spilled-from" not in sent
    assert "x-gtm-peer-token" not in sent
    assert "x-gtm-new-thing" not in sent
    assert (sent["x-gtm-client-country"], sent["x-gtm-location-source"]) == (
        "GB",
        "trusted-proxy-xff",
    )
    assert sent["x-gtm-hops"] == "1"
    assert TierKey(TIER_KEY).check(sent, now=time.time()) == (AuthResult.VALID, "global")
    assert TierKey("another key").check(sent, now=time.time())[0] is AuthResult.BAD_SIGNATURE
    # The front door's own audit record says where the location came from.
    [(_, record)] = list(iter_records([deployment.audit_dir]))
    assert (record.client_country, record.location_source) == ("GB", "trusted-proxy-xff")


async def test_streaming_passes_through(deployment: Deployment) -> None:
    async with deployment.client("gtm-demo-global", "216.160.83.9") as client:
        stream = await client.chat.completions.create(
            model=LLAMA_8B,
            messages=[{"role": "user", "content": "stream please"}],
            max_tokens=16,
            stream=True,
        )
        chunks = [chunk async for chunk in stream]
    assert len(chunks) > 2
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert deployment.stand_ins["us-west"].seen


async def test_residency_refusal_is_451_with_a_json_reason(deployment: Deployment) -> None:
    async with deployment.client("gtm-acme-health-example", STOCKHOLM) as client:
        with pytest.raises(openai.APIStatusError) as info:
            await client.chat.completions.create(
                model=LLAMA_8B, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
    assert info.value.status_code == 451
    body = info.value.response.json()
    assert body["error"]["type"] == "residency_refused"
    assert body["error"]["code"] == "residency:denied"
    assert "Retry-After" not in info.value.response.headers  # the same answer on a retry
    assert not any(s.seen for s in deployment.stand_ins.values())


async def test_allowed_regions_all_down_is_a_retryable_503_not_451(
    deployment: Deployment,
) -> None:
    """451 is for a request no region may serve; when the allowed regions exist but are
    all down it is 503 + Retry-After (the OpenAI SDK retries it), naming the reason, and
    nothing is sent outside the set."""
    for region in ("eu-west", "eu-central"):
        await deployment.stand_ins[region].stop()
    await deployment.tier.health.check_once()
    await deployment.tier.health.check_once()
    async with deployment.client("gtm-demo-eu") as client:
        with pytest.raises(openai.InternalServerError) as info:
            await client.chat.completions.create(
                model=LLAMA_8B, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
    assert info.value.status_code == 503
    assert info.value.response.headers["Retry-After"] == "1"
    error = info.value.response.json()["error"]
    assert error["type"] == "service_unavailable"
    assert error["code"] == "no-available-region"
    assert set(error["allowed_regions"]) == {"eu-west", "eu-central"}
    assert not any(s.seen for s in deployment.stand_ins.values())


async def test_bad_key_is_401(deployment: Deployment) -> None:
    async with deployment.client("gtm-wrong-key") as client:
        with pytest.raises(openai.AuthenticationError):
            await client.chat.completions.create(
                model=LLAMA_8B, messages=[{"role": "user", "content": "x"}]
            )


async def test_retry_on_the_next_allowed_region_then_failover(deployment: Deployment) -> None:
    await deployment.stand_ins["eu-west"].stop()  # dies; the health checks have not noticed
    async with deployment.client("gtm-demo-eu") as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=LLAMA_8B, messages=[{"role": "user", "content": "still there?"}], max_tokens=4
        )
    assert raw.headers["x-gtm-region"] == "eu-central"  # the next region inside the EU set
    sample = deployment.tier.metrics  # counters on the tier's registry
    assert sample.retries.labels("eu-west", "eu-central")._value.get() == 1
    # Two failed health rounds (fall = 2): DNS and the front door stop using eu-west.
    await deployment.tier.health.check_once()
    await deployment.tier.health.check_once()
    view = deployment.tier.keeper.view
    assert view is not None
    assert not view.by_id["eu-west"].available
    dns_address = deployment.tier.endpoints.dns
    assert dns_address is not None
    query = dns.message.make_query(
        "api.inference.example.", "A", use_edns=0, options=[dns.edns.ECSOption("81.2.69.0", 24)]
    )
    reply = await dns.asyncquery.udp(query, dns_address.host, port=dns_address.port, timeout=5)
    assert [r.to_text() for rrset in reply.answer for r in rrset] != [address_of("eu-west")]
    async with deployment.client("gtm-demo-eu") as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=LLAMA_8B, messages=[{"role": "user", "content": "again"}], max_tokens=4
        )
    assert raw.headers["x-gtm-region"] == "eu-central"
    assert sample.retries.labels("eu-west", "eu-central")._value.get() == 1  # no new retry


async def test_route_api_service_endpoints_and_audit(deployment: Deployment) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(
            deployment.http + "/v1/route",
            json={"model": LLAMA_8B, "client_ip": STOCKHOLM, "input_tokens": 100},
            headers={"Authorization": "Bearer gtm-demo-global"},
        ) as response:
            assert response.status == 200
            decision = await response.json()
        assert decision["region"] in ("eu-west", "eu-central")
        assert set(decision["allowed"]) == {"eu-west", "eu-central"}
        assert decision["client"]["country"] == "SE"
        assert decision["trace"]["filters"][0]["plugin"] == "residency"
        for path, status in (("/healthz", 200), ("/readyz", 200)):
            async with http.get(deployment.http + path) as response:
                assert response.status == status
        async with http.get(deployment.http + "/metrics") as response:
            text = await response.text()
        assert 'gtm_global_decisions_total{channel="route",outcome="' in text
        # The sizes of its bounded caches (gtm.geo.CachedLocator, the placement memory).
        sizes = {
            s.name: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name.endswith("_entries")
        }
        assert sizes["gtm_global_location_cache_entries"] >= 1  # Stockholm's address
        assert "gtm_global_placement_memory_entries" in sizes
        assert "gtm_event_loop_tasks" in text
        async with http.post(deployment.http + "/v1/route", json={"model": "m"}) as response:
            assert response.status == 401
    report = verify([deployment.audit_dir])
    assert report.ok
    assert report.records >= 1
    records = [
        json.loads(line)["record"]
        for line in (deployment.audit_dir)
        .glob("global-*.jsonl")
        .__next__()
        .read_text()
        .splitlines()
    ]
    assert records[-1]["client_country"] == "SE"
    assert "prompt" not in json.dumps(records)


async def test_region_header_names_the_region_a_regional_lb_spilled_to(
    deployment: Deployment,
) -> None:
    """The front door keeps the regional LB's ``x-gtm-region`` (where the request was
    really served) instead of overwriting it with the region it forwarded to."""
    deployment.stand_ins["eu-west"].served_by = "eu-central"
    async with deployment.client("gtm-demo-global") as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=LLAMA_8B,
            messages=[{"role": "user", "content": "Hello from London"}],
            max_tokens=4,
        )
    assert raw.headers["x-gtm-region"] == "eu-central"
    assert raw.headers["x-gtm-spilled-from"] == "eu-west"
    assert deployment.stand_ins["eu-west"].seen  # it went to eu-west first


async def test_the_next_turn_goes_back_to_the_region_that_served_a_spill(
    deployment: Deployment,
) -> None:
    """A regional LB that spilled a request names the peer that served it; the front
    door remembers that peer for the conversation's next turn, where the prompt's prefix
    is now cached — not the region it forwarded to, which holds nothing of it."""
    deployment.stand_ins["eu-west"].served_by = "eu-central"
    words = " ".join(f"w{i}" for i in range(2000))
    body = {"model": LLAMA_8B, "messages": [{"role": "user", "content": words}]}
    async with deployment.client("gtm-demo-global") as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=LLAMA_8B, messages=[{"role": "user", "content": words}], max_tokens=4
        )
    assert raw.headers["x-gtm-region"] == "eu-central"
    assert deployment.stand_ins["eu-west"].seen
    hashes = parse_body("/v1/chat/completions", json.dumps(body).encode()).prefix_hashes
    assert hashes
    memory = deployment.tier.front_door._regions_sent.memory
    recall = memory.recall(hashes, time.time())
    assert recall is not None
    assert recall.target == "eu-central"


async def test_a_forward_is_charged_to_its_region_until_it_ends(deployment: Deployment) -> None:
    """The front door's in-flight ledger holds the request while eu-west works on it
    (decisions meanwhile see it), and gives it back when the answer is complete."""
    stand_in = deployment.stand_ins["eu-west"]
    stand_in.gate = asyncio.Event()
    ledger = deployment.tier.front_door.ledger

    async def while_in_flight() -> Unseen:
        await stand_in.arrived.wait()
        charged = ledger.unseen("eu-west", LLAMA_8B)
        assert stand_in.gate is not None
        stand_in.gate.set()
        return charged

    async with deployment.client("gtm-demo-global") as client:
        completion, charged = await asyncio.gather(
            client.chat.completions.create(
                model=LLAMA_8B, messages=[{"role": "user", "content": "count me"}], max_tokens=4
            ),
            while_in_flight(),
        )
    assert completion.choices[0].message.content
    assert charged.requests == 1.0
    assert charged.tokens > 0
    assert ledger.unseen("eu-west", LLAMA_8B) == Unseen()
    assert ledger.unseen("eu-central", LLAMA_8B) == Unseen()


async def test_requests_that_arrive_together_are_decided_on_each_others_charges(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A burst's requests are handled concurrently: each authenticates (an await) before
    it is decided. Each must be decided on the view as it is then, with the charges of
    the requests decided meanwhile; with the view taken on arrival, a whole burst
    herded to one region (seen live with bench/sim_fidelity.py: the front door's
    in-flight ledger did not change a burst's region split)."""
    front_door = deployment.tier.front_door
    # Every view handed out is a distinct object, so which one a decision used shows.
    handed_out: list[object] = []
    current_view = front_door._view

    def view() -> object:
        fresh = copy.copy(current_view())
        handed_out.append(fresh)
        return fresh

    decided: list[tuple[object, object]] = []
    decide = front_door._decide

    def spy(view: object, **kwargs: object) -> object:
        decided.append((view, handed_out[-1]))
        return decide(view, **kwargs)  # type: ignore[arg-type]

    # Both requests are inside (past their first view) before either is decided.
    inside: list[object] = []
    both_inside = asyncio.Event()
    authenticate = front_door._tenant

    async def tenant(request: web.Request, view: object) -> object:
        inside.append(request)
        if len(inside) == 2:
            both_inside.set()
        await both_inside.wait()
        return await authenticate(request, view)  # type: ignore[arg-type]

    monkeypatch.setattr(front_door, "_view", view)
    monkeypatch.setattr(front_door, "_decide", spy)
    monkeypatch.setattr(front_door, "_tenant", tenant)
    async with deployment.client("gtm-demo-global") as client:
        answers = await asyncio.gather(
            *(
                client.chat.completions.create(
                    model=LLAMA_8B, messages=[{"role": "user", "content": text}], max_tokens=4
                )
                for text in ("first", "second")
            )
        )
    assert all(a.choices[0].message.content for a in answers)
    assert len(decided) == 2
    for used, latest in decided:
        assert used is latest  # the view of the moment it was decided


async def test_before_a_policy_is_in_force_requests_are_told_when_to_retry(
    deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restarted front door answers before its first policy generation: a 503 with
    Retry-After (as the regional LB's), in OpenAI's shape, on forwards and /v1/route."""
    monkeypatch.setattr(type(deployment.tier.keeper), "view", property(lambda _self: None))
    async with aiohttp.ClientSession() as session:
        for path, body in (
            (
                "/v1/chat/completions",
                {"model": LLAMA_8B, "messages": [{"role": "user", "content": "hi"}]},
            ),
            ("/v1/route", {"model": LLAMA_8B, "tenant": "acme"}),
        ):
            async with session.post(deployment.http + path, json=body) as response:
                assert response.status == 503, path
                assert response.headers["Retry-After"] == "1"
                error = (await response.json())["error"]
                assert error["code"] == "not_ready"


async def test_health_probes_leave_the_relays_idle_connections_to_expire(
    deployment: Deployment,
) -> None:
    # Three requests at once leave three idle connections to eu-west in the relay's pool.
    async with deployment.client("gtm-demo-global") as client:
        await asyncio.gather(
            *(
                client.chat.completions.create(
                    model=LLAMA_8B, messages=[{"role": "user", "content": f"hi {k}"}], max_tokens=2
                )
                for k in range(3)
            )
        )
    relay = deployment.tier._session
    assert relay is not None

    def idle() -> list[float]:
        # aiohttp's pool: host key -> (protocol, time it was last released), oldest first.
        return sorted(t for conns in relay.connector._conns.values() for _, t in conns)  # type: ignore[union-attr]

    before = idle()
    assert len(before) >= 1
    # Probe rounds used to take the oldest idle connection each time and put it back
    # fresh, so no connection ever idled long enough to close. They go elsewhere now.
    for _ in range(4):
        await deployment.tier.health.check_once()
    assert idle() == before
    assert deployment.tier.health.table.status["eu-west"][0]  # the probes still ran


def _count(histogram: Histogram, **labels: str) -> float:
    """The ``_count`` sample of a labelled histogram child (0 when it has none)."""
    for family in histogram.collect():
        for sample in family.samples:
            if sample.name.endswith("_count") and sample.labels == labels:
                return float(sample.value)
    return 0.0


async def test_front_door_latency_and_tokens_by_served_region_and_model(
    deployment: Deployment,
) -> None:
    """gtm_global_first_byte_seconds, gtm_global_request_duration_seconds and
    gtm_global_tokens_total: the response's usage when it reports one (a JSON body),
    else the front door's prompt estimate and one completion token per streamed chunk;
    the region is the one that served (a regional LB's spill), the model bounded."""
    metrics = deployment.tier.metrics
    async with deployment.client("gtm-demo-global") as client:
        completion = await client.chat.completions.create(
            model=LLAMA_8B, messages=[{"role": "user", "content": "count me"}], max_tokens=8
        )
    assert completion.usage is not None
    where = {"region": "eu-west", "model": LLAMA_8B}
    assert _count(metrics.first_byte, **where) == 1
    assert _count(metrics.request_seconds, **where) == 1
    tokens = metrics.tokens
    assert (
        tokens.labels("eu-west", LLAMA_8B, "prompt")._value.get() == completion.usage.prompt_tokens
    )
    assert (
        tokens.labels("eu-west", LLAMA_8B, "completion")._value.get()
        == completion.usage.completion_tokens
    )

    deployment.stand_ins["eu-west"].served_by = "eu-central"  # the regional LB spilled it
    async with deployment.client("gtm-demo-global") as client:
        stream = await client.chat.completions.create(
            model=LLAMA_8B,
            messages=[{"role": "user", "content": "stream me"}],
            max_tokens=6,
            stream=True,
        )
        chunks = [c async for c in stream if c.choices]  # the estimate: one per choice chunk
    spilled = {"region": "eu-central", "model": LLAMA_8B}
    assert _count(metrics.request_seconds, **spilled) == 1
    assert tokens.labels("eu-central", LLAMA_8B, "completion")._value.get() == len(chunks)
    assert tokens.labels("eu-central", LLAMA_8B, "prompt")._value.get() > 0  # the estimate
