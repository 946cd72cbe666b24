"""The endpoints sglang-router and vllm-router poll (gpusim.peer_api), answered from the
engine's own state in the shapes those routers parse."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gpusim.driver import Notifier
from gpusim.engine import EngineRequest
from gpusim.peer_api import PATHS, reachable
from gpusim.server import GpuSimConfig, GpuSimServer
from gtm.gpu_profiles import LLAMA_8B, get_profile
from gtm.kv_events import KVEventsConfig
from gtm.metrics import new_registry
from gtm.tokens import encode_text

Client = TestClient[web.Request, web.Application]


@pytest.fixture
def server() -> GpuSimServer:
    return GpuSimServer(GpuSimConfig(gpu_type="H100"), registry=new_registry())


@pytest.fixture
async def client(server: GpuSimServer) -> AsyncIterator[Client]:
    async with TestClient(TestServer(server.build_app())) as test_client:
        yield test_client


async def test_every_path_is_served(client: Client) -> None:
    for path in PATHS:
        if path.endswith("/render"):
            response = await client.post(path, json={"model": LLAMA_8B, "prompt": "a b"})
        else:
            response = await client.get(path)
        assert response.status == 200, path


async def test_get_load_is_sglangs_array_and_counts_queued_work(
    client: Client, server: GpuSimServer
) -> None:
    idle = await (await client.get("/get_load")).json()
    assert idle == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]
    # Two requests queued (the engine loop is not running: they stay waiting).
    driver = server.driver(LLAMA_8B)
    for k in range(2):
        driver.submit(EngineRequest(f"r{k}", 1000, 10), Notifier(), "length")
    busy = await (await client.get("/get_load")).json()
    assert busy == [{"dp_rank": 0, "num_reqs": 2, "num_waiting_reqs": 2, "num_tokens": 2000}]
    # sglang-router sums num_tokens over the entries; vllm-router reads an object's
    # "load", which an array does not have: it falls back to its own counts.
    assert sum(e["num_tokens"] for e in busy) == 2000


async def test_server_info_gives_the_block_size_and_limits(client: Client) -> None:
    profile = get_profile("H100", LLAMA_8B)
    for path in ("/server_info", "/get_server_info"):
        info = await (await client.get(path)).json()
        assert info["model_path"] == LLAMA_8B
        assert info["kv_block_size"] == info["page_size"] == profile.block_size
        assert info["max_total_num_tokens"] == profile.kv_capacity_tokens
        assert info["context_length"] == profile.max_model_len
        assert info["max_running_requests"] == profile.max_num_seqs
    model = await (await client.get("/model_info")).json()
    assert model["model_path"] == LLAMA_8B
    assert model["is_generation"] is True


async def test_render_returns_the_token_ids_the_engine_charges(client: Client) -> None:
    response = await client.post(
        "/v1/completions/render", json={"model": LLAMA_8B, "prompt": ["one two", "three"]}
    )
    rendered = await response.json()
    assert [r["token_ids"] for r in rendered] == [
        list(encode_text("one two")),
        list(encode_text("three")),
    ]
    assert all(r["request_id"].startswith("cmpl-") and r["model"] == LLAMA_8B for r in rendered)
    # Token-id prompts are passed through; text and ids may not mix in one prompt list,
    # but a list of id lists is several prompts.
    ids = await client.post(
        "/v1/completions/render", json={"model": LLAMA_8B, "prompt": [[5, 6], [7]]}
    )
    assert [r["token_ids"] for r in await ids.json()] == [[5, 6], [7]]
    unknown = await client.post("/v1/completions/render", json={"model": "m", "prompt": "x"})
    assert unknown.status == 404
    bad = await client.post("/v1/completions/render", json={"prompt": "x"})
    assert bad.status == 400


async def test_kv_event_sources_are_empty_without_kv_events(client: Client) -> None:
    assert await (await client.get("/kv_event_sources")).json() == []


def test_a_wildcard_endpoint_is_shown_with_the_address_the_caller_reached() -> None:
    assert reachable("tcp://*:5557", "127.0.0.1") == "tcp://127.0.0.1:5557"
    assert reachable("tcp://0.0.0.0:5557", "10.0.0.2") == "tcp://10.0.0.2:5557"
    assert reachable("tcp://[::]:5557", "::1") == "tcp://[::1]:5557"
    assert reachable("tcp://192.0.2.1:5557", "127.0.0.1") == "tcp://192.0.2.1:5557"
    assert reachable("ipc:///tmp/kv", "127.0.0.1") == "ipc:///tmp/kv"


async def test_kv_event_sources_list_the_publishers_bound_endpoints() -> None:
    events = KVEventsConfig(
        enable_kv_cache_events=True,
        endpoint="tcp://127.0.0.1:*",
        replay_endpoint="tcp://127.0.0.1:*",
        topic="kv",
    )
    server = GpuSimServer(GpuSimConfig(kv_events=events), registry=new_registry())
    publisher = server.kv_events
    assert publisher is not None
    publisher.open()
    try:
        async with TestClient(TestServer(server.build_app())) as test_client:
            sources = await (await test_client.get("/kv_event_sources")).json()
    finally:
        publisher.close()
    assert sources == [
        {
            "data_parallel_rank": 0,
            "endpoint": publisher.endpoint,
            "replay_endpoint": publisher.replay_endpoint,
            "topic": "kv",
        }
    ]
    assert publisher.endpoint.startswith("tcp://127.0.0.1:")
    assert not publisher.endpoint.endswith(":*")
