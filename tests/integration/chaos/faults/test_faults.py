"""Every fault kind injected into one small real deployment (``gtm up --processes``,
3-member etcd, every fault-proxy link kind), its effect observed, and rolled back.

The tests share the deployment (module scope) and each leaves it as it found it: that
is itself a check of the rollbacks."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest

from chaos.deployment import Deployment, UnknownTarget
from chaos.faults import (
    AllHealthChecksFailFault,
    DrainFault,
    EtcdCompactFault,
    EtcdKillLeaderFault,
    EtcdStopFault,
    FaultError,
    GpuFault,
    GpuFaultMode,
    KillFault,
    LatencyFault,
    PartitionFault,
    PartitionMode,
    PauseFault,
    PolicyPushFault,
    PolicyPushInjected,
)
from chaos.faults.process import pid_alive, proc_state
from chaos.proxy.client import ToxiproxyClient
from gtm.errors import CompactedError, StateUnavailable
from gtm.models import DrainTarget
from gtm.policy_store import load_from_store
from gtm.state import keys
from tests.integration.chaos.faults.conftest import eventually

pytestmark = [
    pytest.mark.integration,
    pytest.mark.etcd,
    pytest.mark.timeout(120),
    pytest.mark.asyncio(loop_scope="module"),
]

#: A held-down child must stay down at least this long: several restart backoffs
#: (gtmctl.up.processes.RESTART_BACKOFF starts at 0.5 s).
HELD_FOR_S = 1.5


async def healthz_seconds(url: str, timeout_s: float = 5.0) -> float:
    started = time.monotonic()
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
        session.get(f"{url}/healthz") as response,
    ):
        await response.read()
    return time.monotonic() - started


async def answers(url: str) -> bool:
    """Whether ``url``/healthz answers 200 now."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as session,
            session.get(f"{url}/healthz") as response,
        ):
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def put_eventually(deployment: Deployment, key: str) -> int:
    store = deployment.store()
    deadline = time.monotonic() + 15.0
    while True:
        try:
            return await store.put(key, b"x")
        except StateUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def test_the_document_names_everything(deployment: Deployment) -> None:
    assert set(deployment.regions) == {"eu-west", "eu-central"}
    assert deployment.zone("eu-west-a").region == "eu-west"
    assert len(deployment.gpus) == 2
    assert all(g.url for g in deployment.gpus.values())
    assert all(g.port for g in deployment.gpus.values())
    assert set(deployment.pids) >= {"global", "regional/eu-west", "zone/eu-west-a"}
    assert len(deployment.etcd_members) == 3
    assert deployment.chaos_api_url is not None
    assert "global->regional.eu-west" in deployment.links
    assert deployment.front_door_url.startswith("http://127.0.0.1:")
    assert deployment.dns.port > 0
    with pytest.raises(UnknownTarget, match=r"unknown region 'us-east'.*eu-central, eu-west"):
        deployment.region("us-east")


async def test_kill_holds_the_process_down_until_rollback(deployment: Deployment) -> None:
    await deployment.refresh()
    before = deployment.child("regional/eu-west")
    assert before.pid is not None
    injected = await KillFault(tier="regional/eu-west").inject(deployment)
    assert "regional/eu-west" in injected.describe()
    assert not pid_alive(before.pid)
    await asyncio.sleep(HELD_FOR_S)  # the point: nothing restarts it meanwhile
    await deployment.refresh()
    held = deployment.child("regional/eu-west")
    assert held.pid is None
    assert held.held
    await injected.rollback()
    await injected.rollback()  # idempotent
    await deployment.refresh()
    after = deployment.child("regional/eu-west")
    assert after.pid is not None
    assert after.pid != before.pid
    assert not after.held
    assert after.restarts == before.restarts + 1
    await eventually(lambda: answers(deployment.region("eu-west").url), "eu-west answers again")


async def test_kill_of_an_unknown_tier_names_the_known_ones(deployment: Deployment) -> None:
    with pytest.raises(UnknownTarget, match=r"unknown tier 'regional/us-east'.*regional/eu-west"):
        await KillFault(tier="regional/us-east").inject(deployment)


async def test_pause_stops_and_continues(deployment: Deployment) -> None:
    injected = await PauseFault(tier="zone/eu-central-a").inject(deployment)
    pid = deployment.child("zone/eu-central-a").pid
    assert pid is not None
    assert proc_state(pid) == "T"
    await injected.rollback()
    assert proc_state(pid) != "T"


async def test_gpu_slow_fault_shows_in_the_worker_and_clears(deployment: Deployment) -> None:
    gpu = next(iter(deployment.gpus))
    url = f"{deployment.gpu(gpu).url}/admin/faults"
    injected = await GpuFault(gpu=gpu, mode=GpuFaultMode.SLOW, slowdown=8).inject(deployment)
    async with deployment.session.get(url) as response:
        assert (await response.json())["slowdown"] == 8
    await injected.rollback()
    async with deployment.session.get(url) as response:
        assert (await response.json())["slowdown"] == 1


async def test_gpu_crash_stays_down_until_rollback(deployment: Deployment) -> None:
    gpu = next(g for g in deployment.gpus if deployment.gpu(g).region == "eu-central")
    tier = f"gpu/{gpu}"
    await deployment.refresh()
    pid = deployment.child(tier).pid
    assert pid is not None
    injected = await GpuFault(gpu=gpu, mode=GpuFaultMode.CRASH).inject(deployment)
    assert not pid_alive(pid)
    await deployment.refresh()
    assert deployment.child(tier).pid is None
    assert deployment.child(tier).held
    await injected.rollback()
    await deployment.refresh()
    assert deployment.child(tier).pid not in (None, pid)

    async def serving() -> bool:
        url = (await deployment.refresh()).gpus
        return await answers(next(g.url for g in url if g.name == gpu) or "")

    await eventually(serving, "the crashed GPU serves again")


async def test_drain_is_in_the_store_until_rollback(deployment: Deployment) -> None:
    key = keys.drain(DrainTarget.ZONE, "eu-west-a")
    injected = await DrainFault(zone="eu-west-a").inject(deployment)
    assert await deployment.store().get(key) is not None
    await injected.rollback()
    assert await deployment.store().get(key) is None
    with pytest.raises(UnknownTarget, match="unknown zone 'eu-west-z'"):
        await DrainFault(zone="eu-west-z").inject(deployment)


async def test_latency_toxic_slows_exactly_that_link(deployment: Deployment) -> None:
    link = deployment.links["global->regional.eu-west"]
    other = deployment.links["global->regional.eu-central"]
    injected = await LatencyFault(
        source="global", target="regional/eu-west", latency_ms=400
    ).inject(deployment)
    assert await healthz_seconds(f"http://{link.listen}") >= 0.4
    assert await healthz_seconds(f"http://{other.listen}") < 0.4
    assert deployment.chaos_api_url is not None
    with ToxiproxyClient(deployment.chaos_api_url) as client:
        assert {t.type for t in client.toxics(link.name)} == {"latency"}
        await injected.rollback()
        assert client.toxics(link.name) == []


async def test_partition_black_holes_and_rollback_heals(deployment: Deployment) -> None:
    link = deployment.links["global->regional.eu-central"]
    injected = await PartitionFault(source="global", target="regional/eu-central").inject(
        deployment
    )
    with pytest.raises(TimeoutError):
        await healthz_seconds(f"http://{link.listen}", timeout_s=1.0)
    await injected.rollback()
    assert await healthz_seconds(f"http://{link.listen}") < 1.0


async def test_partition_refuse_and_unknown_links(deployment: Deployment) -> None:
    links = [n for n, k in deployment.links.items() if k.source == "zone/eu-west-a"]
    assert len(links) == 3  # one per etcd member
    injected = await PartitionFault(
        source="zone/eu-west-a", target="etcd/*", mode=PartitionMode.REFUSE
    ).inject(deployment)
    assert deployment.chaos_api_url is not None
    with ToxiproxyClient(deployment.chaos_api_url) as client:
        assert not any(client.get_proxy(n).enabled for n in links)
        await injected.rollback()
        assert all(client.get_proxy(n).enabled for n in links)
    with pytest.raises(UnknownTarget, match="no fault-proxy link from 'zone/nowhere'"):
        await PartitionFault(source="zone/nowhere", target="etcd/*").inject(deployment)


async def test_all_health_checks_fail_makes_the_global_lb_fail_open(
    deployment: Deployment,
) -> None:
    injected = await AllHealthChecksFailFault().inject(deployment)

    async def fail_open() -> bool:
        async with deployment.session.get(f"{deployment.front_door_url}/metrics") as response:
            text = await response.text()
        return "gtm_global_health_fail_open 1.0" in text

    try:
        await eventually(fail_open, "the global LB fails open")
    finally:
        await injected.rollback()

    async def recovered() -> bool:
        return not await fail_open()

    await eventually(recovered, "the global LB trusts its probes again")


async def test_etcd_kill_leader_elects_another_and_rollback_restarts_it(
    deployment: Deployment,
) -> None:
    await deployment.refresh()
    # By default the leader killed is the member the tiers talk to (moved there first).
    leader = deployment.etcd_clients_member
    injected = await EtcdKillLeaderFault().inject(deployment)
    assert leader in injected.describe()
    await deployment.refresh()
    assert deployment.etcd_member(leader).pid is None
    await put_eventually(deployment, "/gtm/v1/chaos-test/after-leader-kill")
    assert await deployment.etcd_leader() != leader
    await injected.rollback()
    await deployment.refresh()
    assert deployment.etcd_member(leader).pid is not None


async def test_etcd_stop_takes_the_store_down_and_rollback_restores_it(
    deployment: Deployment,
) -> None:
    key = "/gtm/v1/chaos-test/kept"
    await put_eventually(deployment, key)
    injected = await EtcdStopFault().inject(deployment)
    try:
        doc = await deployment.refresh()  # the control API works without etcd
        assert all(m.pid is None for m in doc.etcd)
        assert all(g.url for g in doc.gpus)  # last known addresses
        with pytest.raises(StateUnavailable):
            await deployment.store().get(key)
    finally:
        await injected.rollback()
    await put_eventually(deployment, "/gtm/v1/chaos-test/after-restart")
    kv = await deployment.store().get(key)
    assert kv is not None


async def test_etcd_compact_cancels_watches_from_older_revisions(
    deployment: Deployment,
) -> None:
    store = deployment.store()
    old = await put_eventually(deployment, "/gtm/v1/chaos-test/compact")
    await put_eventually(deployment, "/gtm/v1/chaos-test/compact")
    injected = await EtcdCompactFault().inject(deployment)
    assert "compact at revision" in injected.describe()
    watch = store.watch("/gtm/v1/chaos-test/", start_revision=old)
    with pytest.raises(CompactedError):
        await asyncio.wait_for(anext(watch), 10.0)
    await watch.aclose()
    await injected.rollback()  # nothing to undo, and that is fine


async def test_policy_push_bad_is_rejected_good_is_applied_and_rolled_back(
    deployment: Deployment, tmp_path: Path
) -> None:
    store = deployment.store()
    before = await load_from_store(store)
    assert before is not None
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Tenants\nexploit: !!python/object/apply:os.system ['true']\n")
    rejected = await PolicyPushFault(paths=(bad,)).inject(deployment)
    assert isinstance(rejected, PolicyPushInjected)
    assert not rejected.applied
    assert rejected.error
    assert "rejected" in rejected.describe()
    unchanged = await load_from_store(store)
    assert unchanged is not None
    assert unchanged.generation == before.generation

    examples = Path(__file__).parents[4] / "policies" / "examples"
    pushed = await PolicyPushFault(paths=(examples,)).inject(deployment)
    assert isinstance(pushed, PolicyPushInjected)
    assert pushed.applied
    now = await load_from_store(store)
    assert now is not None
    assert now.generation == before.generation + 1
    assert now.policy_set.digest != before.policy_set.digest
    await pushed.rollback()
    restored = await load_from_store(store)
    assert restored is not None
    assert restored.policy_set.digest == before.policy_set.digest


async def test_a_fault_on_a_held_tier_says_so(deployment: Deployment) -> None:
    injected = await KillFault(tier="zone/eu-central-a").inject(deployment)
    try:
        with pytest.raises(FaultError, match="not running"):
            await PauseFault(tier="zone/eu-central-a").inject(deployment)
    finally:
        await injected.rollback()


async def test_the_control_api_needs_the_operator_token(deployment: Deployment) -> None:
    url = f"{deployment.control_url}/api/v1/children/global/hold"
    async with deployment.session.post(url) as response:
        assert response.status == 401
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    async with deployment.session.get(f"{deployment.control_url}/api/v1/deployment") as response:
        assert response.status == 401
    await deployment.refresh()
    assert deployment.child("global").held is False


async def test_the_control_api_names_what_exists(deployment: Deployment) -> None:
    headers = deployment.auth_headers()
    url = f"{deployment.control_url}/api/v1/children/regional%2Fus-east/hold"
    async with deployment.session.post(url, headers=headers) as response:
        assert response.status == 404
        body = await response.json()
    assert "no child 'regional/us-east'" in body["error"]
    assert "regional/eu-west" in body["error"]
    url = f"{deployment.control_url}/api/v1/etcd/members/etcd-9/kill"
    async with deployment.session.post(url, headers=headers) as response:
        assert response.status == 404
        assert "etcd-1" in (await response.json())["error"]


async def test_attach_sees_the_same_deployment(deployment: Deployment) -> None:
    token = deployment.auth_headers()["Authorization"].removeprefix("Bearer ")
    async with Deployment.attach(deployment.status_url, admin_token=token) as attached:
        assert attached.document.front_door_url == deployment.front_door_url
        await deployment.refresh()
        assert set(attached.pids) == set(deployment.pids)
        assert attached.etcd_members.keys() == deployment.etcd_members.keys()
