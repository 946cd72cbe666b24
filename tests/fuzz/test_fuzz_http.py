"""Fuzzed HTTP JSON bodies, over real HTTP to the emulator (every OpenAI endpoint and the
admin fault API) and straight into each tier's body parser. Invariants: never a 5xx or
a dropped connection, every refusal is a JSON error in OpenAI's shape, and after each
batch the server still answers a valid request correctly."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from global_lb.errors import BadRequest as GlobalBadRequest
from global_lb.request import parse_body
from gpusim.faults import Faults
from gpusim.server import GpuSimConfig, GpuSimServer
from gtm.metrics import new_registry
from gtm.openai_errors import ApiError
from gtm.openai_request import parse_json_body
from regional_lb.request import Endpoint as RegionalEndpoint
from regional_lb.request import body_facts
from tests.fuzz.profiles import fuzz_settings
from tests.fuzz.strategies import EMBEDDING_MODEL, JSON, MODEL, VALID, http_body
from tests.fuzz.threaded import Client, LoopThread
from zone_agent.request import Endpoint as ZoneEndpoint
from zone_agent.request import zone_request

pytestmark = pytest.mark.timeout(120)

#: What a fuzzed request may be answered with: success, or a client error.
ACCEPTABLE = {200, 400, 404, 413, 422, 429}


@dataclass
class Emulator:
    client: Client
    server: GpuSimServer
    exits: list[int]

    def valid_completion_ok(self) -> None:
        for path, body in VALID.items():
            status, payload = self.client.json("POST", path, body)
            assert status == 200, payload
            assert payload.get("choices") or payload.get("data"), payload
        status, models = self.client.json("GET", "/v1/models")
        assert status == 200
        assert sorted(m["id"] for m in models["data"]) == sorted([MODEL, EMBEDDING_MODEL])


@pytest.fixture(scope="module")
def emulator() -> Iterator[Emulator]:
    loop = LoopThread()
    exits: list[int] = []

    async def start() -> GpuSimServer:
        config = GpuSimConfig(port=0, speedup=1e5, models=(MODEL, EMBEDDING_MODEL), warmup_passes=0)
        server = GpuSimServer(config, registry=new_registry(), exit_fn=exits.append)
        await server.start()
        return server

    server = loop.run(start())
    client = Client("127.0.0.1", server.port)
    try:
        yield Emulator(client, server, exits)
    finally:
        client.close()
        loop.run(server.stop())
        loop.close()


def _assert_error_shape(status: int, headers: dict[str, str], data: bytes) -> None:
    assert status in ACCEPTABLE, (status, data[:300])
    if status != 200:
        error = json.loads(data)["error"]
        assert set(error) >= {"message", "type", "code"}
        assert isinstance(error["message"], str)
        assert error["message"]


def test_openai_endpoints_survive_fuzzed_bodies(emulator: Emulator) -> None:
    @fuzz_settings(400)
    @given(data=st.data())
    def batch(data: st.DataObject) -> None:
        path = data.draw(st.sampled_from(sorted(VALID)))
        body = data.draw(http_body(path))
        status, headers, payload = emulator.client.request("POST", path, body)
        _assert_error_shape(status, headers, payload)

    batch()
    emulator.valid_completion_ok()


FAULT_FIELDS = sorted(Faults.model_fields)


@st.composite
def fault_bodies(draw: st.DrawFn) -> bytes:
    keys = draw(st.lists(st.sampled_from(FAULT_FIELDS) | st.text(max_size=8), max_size=4))
    body = {k: draw(JSON | st.floats(min_value=-10, max_value=2000)) for k in keys}
    if draw(st.booleans()):
        return json.dumps(body).encode()
    return draw(st.binary(max_size=64))


def test_admin_fault_api_survives_fuzzed_bodies(emulator: Emulator) -> None:
    @fuzz_settings(200)
    @given(body=fault_bodies())
    def batch(body: bytes) -> None:
        status, headers, payload = emulator.client.request("POST", "/admin/faults", body)
        _assert_error_shape(status, headers, payload)
        status, _, _ = emulator.client.request("DELETE", "/admin/faults")
        assert status == 200

    batch()
    status, faults = emulator.client.json("GET", "/admin/faults")
    assert status == 200
    assert faults == Faults().model_dump()
    emulator.valid_completion_ok()


@st.composite
def any_body(draw: st.DrawFn) -> bytes:
    path = draw(st.sampled_from(sorted(VALID)))
    return draw(http_body(path) | st.just(b"[" * 5000 + b"]" * 5000))


@fuzz_settings(1000)
@given(raw=any_body(), endpoint=st.integers(min_value=0, max_value=2))
def test_every_tier_parser_answers_400_or_a_request(raw: bytes, endpoint: int) -> None:
    """The front door's, regional LB's and zone agent's parsers (sans-io): a fuzzed body
    is either understood or refused with the tier's 400 error — nothing else escapes."""
    path = sorted(VALID)[endpoint]
    refusal = _refusal(lambda: parse_body(path, raw), GlobalBadRequest)
    assert refusal is None or str(refusal)
    zone = {
        "/v1/chat/completions": ZoneEndpoint.CHAT,
        "/v1/completions": ZoneEndpoint.COMPLETION,
        "/v1/embeddings": ZoneEndpoint.EMBEDDING,
    }
    body: Mapping[str, object] = {}

    def parse() -> None:
        nonlocal body
        body = parse_json_body(raw)

    refusal = _refusal(parse, ApiError)
    if refusal is not None:
        assert isinstance(refusal, ApiError)
        assert refusal.status == 400
        return
    for tier_parse in (
        lambda: body_facts(body, RegionalEndpoint(path)),
        lambda: zone_request(body, zone[path], request_id="fuzz"),
    ):
        refusal = _refusal(tier_parse, ApiError)
        if refusal is not None:
            assert isinstance(refusal, ApiError)
            assert refusal.status == 400
            assert refusal.message


def _refusal(call: Callable[[], object], expected: type[Exception]) -> Exception | None:
    """The ``expected`` error ``call`` raised, or None; any other exception propagates."""
    try:
        call()
    except expected as exc:
        return exc
    return None
