"""The zone agent reads a real gpu-sim's KV events over ZMQ on loopback.

The index the GPU decision reads (the agent's prefix index) loses a prompt's blocks once
the emulator evicts them — the agent's own record alone (today's behaviour, the control
here) keeps claiming the whole prompt is cached there. A subscriber that joins late sees
a sequence gap and fills it from the replay endpoint; garbage frames are counted and
skipped.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import zmq
import zmq.asyncio
from prometheus_client import CollectorRegistry

from gtm.gpu_profiles import LLAMA_8B
from gtm.kv_events import BlockRemoved, KVEventsConfig, encode_batch, seq_bytes
from gtm.metrics import new_registry
from gtm.tasks import TaskSupervisor
from gtm.tokens import DEFAULT_BLOCK_SIZE, encode_text
from tests.integration.gpusim.conftest import SimFactory
from tests.integration.gpusim.conftest import make_sim as make_sim
from zone_agent.kv_events import (
    EngineBlocks,
    EvictingPrefixIndex,
    KVEventMetrics,
    KVEventSource,
    KVEventSubscriber,
)
from zone_agent.prefix import DictPrefixIndex
from zone_agent.request import Endpoint, zone_request

pytestmark = pytest.mark.integration

CONFIG = KVEventsConfig(
    enable_kv_cache_events=True,
    endpoint="tcp://127.0.0.1:*",
    replay_endpoint="tcp://127.0.0.1:*",
    topic="kv",
)
SLOT = 0
#: How long a test waits for events over real sockets; a bound, not a sleep.
EVENTUALLY_S = 10.0
CAPACITY = 10_000  # the agent's own LRU never forgets here: only events do


def _prompt(word: str) -> str:
    return " ".join(f"{word}{i}" for i in range(300))


@pytest.fixture
async def context() -> AsyncIterator[zmq.asyncio.Context]:
    ctx = zmq.asyncio.Context()
    yield ctx
    ctx.term()


def _value(registry: object, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0  # type: ignore[attr-defined]


async def _until(condition: object, *, poke: object = None) -> None:
    """Until ``condition()`` holds (bounded: the events cross real sockets), calling
    ``poke()`` in between to make more of them."""
    assert callable(condition)
    deadline = asyncio.get_running_loop().time() + EVENTUALLY_S
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "never happened"
        if poke is not None:
            assert callable(poke)
            await poke()
        await asyncio.sleep(0.005)


def _subscribe(
    context: zmq.asyncio.Context,
    registry: CollectorRegistry,
    source: KVEventSource,
    endpoint: str,
    replay: str | None,
    *,
    topic: str = "",
    slot: int = SLOT,
) -> tuple[KVEventSubscriber, TaskSupervisor, asyncio.Task[object]]:
    """A subscriber for ``slot`` running as a supervised task (``aclose`` the supervisor)."""
    subscriber = KVEventSubscriber(
        gpu_id=f"gpu-{slot}",
        slot=slot,
        endpoint=endpoint,
        replay_endpoint=replay,
        topic=topic,
        source=source,
        metrics=KVEventMetrics(registry),
        context=context,
    )
    tasks = TaskSupervisor(registry=registry, component="test")
    return subscriber, tasks, tasks.spawn("kv-events", subscriber.run())


async def test_an_evicted_prefix_stops_matching_and_a_gap_is_replayed(
    make_sim: SimFactory, context: zmq.asyncio.Context
) -> None:
    sim = await make_sim(models=(LLAMA_8B,), num_gpu_blocks=64, kv_events=CONFIG)
    publisher = sim.server.kv_events
    assert publisher is not None
    registry = new_registry()
    engine = EngineBlocks()
    index = EvictingPrefixIndex(engine)
    control = DictPrefixIndex()  # the agent's record alone
    source = KVEventSource(engine)

    async def send(prompt: str) -> tuple[int, ...]:
        body = {"model": LLAMA_8B, "prompt": prompt, "max_tokens": 1}
        facts = zone_request(body, Endpoint.COMPLETION, request_id="r")
        for agent_index in (index, control):
            agent_index.insert(SLOT, facts.prefix_hashes, CAPACITY)
        source.sent(encode_text(prompt), DEFAULT_BLOCK_SIZE, facts.prefix_hashes)
        await sim.complete(prompt)
        return facts.prefix_hashes

    alpha = await send(_prompt("alpha"))
    await _until(lambda: publisher.sequence >= 1)
    # The subscriber joins after the first batch went out: its first message is a gap.
    subscriber, tasks, _ = _subscribe(
        context, registry, source, publisher.endpoint, publisher.replay_endpoint, topic="kv"
    )
    try:
        assert index.match_groups(alpha) == [(len(alpha), 1 << SLOT)]
        filler = iter(range(1000))

        async def poke() -> None:  # more events until the late SUB has joined
            await sim.complete(f"filler {next(filler)} " * 20)

        await _until(lambda: subscriber.last_seq >= 0, poke=poke)
        assert _value(registry, "gtm_zone_kv_event_gaps_total", gpu="gpu-0") == 1
        assert (
            _value(registry, "gtm_zone_kv_event_replays_total", gpu="gpu-0", outcome="filled") == 1
        )
        assert subscriber.last_seq == publisher.sequence - 1 or subscriber.last_seq >= 1

        await send(_prompt("beta"))  # does not fit beside alpha: alpha's tail is evicted
        await _until(
            lambda: subscriber.last_seq >= publisher.sequence - 1 and engine.evicted_blocks > 0
        )
        held = index.match_groups(alpha)
        assert held, "alpha's first blocks are still cached there"
        (depth, mask), *_ = held
        assert mask == 1 << SLOT
        assert depth < len(alpha)  # the evicted tail no longer counts
        # Today's agent, on its own record, still claims every block of alpha.
        assert control.match_groups(alpha) == [(len(alpha), 1 << SLOT)]
        assert _value(registry, "gtm_zone_kv_events_applied_total", gpu="gpu-0") > 0

        # Sending alpha there again makes it the GPU's again, at once.
        await send(_prompt("alpha"))
        assert index.match_groups(alpha) == [(len(alpha), 1 << SLOT)]
    finally:
        await tasks.aclose()
    # A stream that ends is stale: the agent's record decides again.
    assert len(engine) == 0


async def test_garbage_frames_are_counted_and_skipped(context: zmq.asyncio.Context) -> None:
    pub = context.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind("tcp://127.0.0.1:*")
    endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
    registry = new_registry()
    engine = EngineBlocks()
    source = KVEventSource(engine)
    subscriber, tasks, task = _subscribe(context, registry, source, endpoint, None, slot=3)
    good = encode_batch(1.0, [BlockRemoved(block_hashes=(1,))])
    garbage = [
        (b"", b"\x00"),  # two frames
        (b"", b"short", good),  # a bad sequence frame
        (b"", seq_bytes(0), b"\xc1\xc1"),  # not msgpack
        (b"", seq_bytes(0), b"\x93\x01\x02\x03"),  # not a batch
        (b"", seq_bytes(0), encode_batch(1.0, [])[:-3]),  # truncated
    ]
    try:
        sent = 0

        async def poke() -> None:
            nonlocal sent
            for frames in garbage:
                await pub.send_multipart(frames)
            await pub.send_multipart((b"", seq_bytes(sent), good))
            sent += 1

        await _until(lambda: subscriber.last_seq >= 0, poke=poke)
        assert not task.done()
        assert _value(registry, "gtm_zone_kv_event_decode_errors_total", gpu="gpu-3") >= len(
            garbage
        )
        assert _value(registry, "gtm_zone_kv_events_applied_total", gpu="gpu-3") >= 1
    finally:
        await tasks.aclose()
        pub.close(linger=0)


async def test_a_restarted_worker_is_stale_then_read_again(
    make_sim: SimFactory, context: zmq.asyncio.Context, tmp_path: Path
) -> None:
    # ipc:// endpoints, which vLLM binds: the restarted worker takes the same ones.
    config = KVEventsConfig(
        enable_kv_cache_events=True,
        endpoint=f"ipc://{tmp_path}/pub",
        replay_endpoint=f"ipc://{tmp_path}/replay",
    )
    registry = new_registry()
    engine = EngineBlocks()
    index = EvictingPrefixIndex(engine)
    source = KVEventSource(engine)
    _, tasks, _ = _subscribe(context, registry, source, config.endpoint, config.replay_endpoint)
    prompt = _prompt("gamma")
    facts = zone_request(
        {"model": LLAMA_8B, "prompt": prompt, "max_tokens": 1},
        Endpoint.COMPLETION,
        request_id="r",
    )
    source.sent(encode_text(prompt), DEFAULT_BLOCK_SIZE, facts.prefix_hashes)
    try:
        for restart in range(2):
            sim = await make_sim(models=(LLAMA_8B,), num_gpu_blocks=4096, kv_events=config)
            await sim.complete(prompt)
            # Other prompts make more events until the subscriber has joined; its first
            # one is a gap, filled from the replay buffer, prompt's events included.
            fillers = (f"filler {restart} {i} " * 20 for i in itertools.count())
            # The worker's engine holds the prompt: the index says so, without the agent
            # ever having sent it there.
            await _until(
                lambda: (
                    index.match_groups(facts.prefix_hashes)
                    == [(len(facts.prefix_hashes), 1 << SLOT)]
                ),
                poke=lambda: sim.complete(next(fillers)),  # noqa: B023 (awaited here)
            )
            await sim.server.stop()
            await _until(lambda: len(engine) == 0)
            assert _value(registry, "gtm_zone_kv_events_stale", gpu="gpu-0") == 1
            assert (
                _value(registry, "gtm_zone_kv_event_disconnects_total", gpu="gpu-0") == restart + 1
            )
            assert index.match_groups(facts.prefix_hashes) == []
    finally:
        await tasks.aclose()
