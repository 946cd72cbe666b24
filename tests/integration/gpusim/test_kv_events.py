"""gtm gpu-sim --kv-events-config: the emulator publishes vLLM's KV events over real ZMQ.

A subscriber reads them as vLLM's example subscriber does (SUB on the endpoint, REQ-style
replay on the ROUTER): a prompt's blocks come out as one BlockStored with the emulator's
tokens and block hashes, its eviction as BlockRemoved, and the replay endpoint answers
the same payloads the PUB socket sent.
"""

from __future__ import annotations

import asyncio

import pytest
import zmq
import zmq.asyncio

from gtm.gpu_profiles import LLAMA_8B
from gtm.kv_events import (
    BlockRemoved,
    BlockStored,
    EventBatch,
    KVEventsConfig,
    decode_batch,
    read_seq,
    seq_bytes,
)
from gtm.tokens import DEFAULT_BLOCK_SIZE, block_hashes, encode_text

from .conftest import SimFactory

pytestmark = pytest.mark.integration

TOPIC = "kv-events"
CONFIG = KVEventsConfig(
    enable_kv_cache_events=True,
    endpoint="tcp://127.0.0.1:*",
    replay_endpoint="tcp://127.0.0.1:*",
    topic=TOPIC,
)
#: 64 blocks of 16 tokens: two ~600-token prompts do not fit together.
BLOCKS = 64


def _prompt(word: str) -> str:
    return " ".join(f"{word}{i}" for i in range(300))


async def _replay(ctx: zmq.asyncio.Context, endpoint: str, start: int) -> list[tuple[int, bytes]]:
    """Every buffered (seq, payload) from ``start`` on, through a DEALER speaking REQ's
    envelope (an empty delimiter), until the end marker."""
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    try:
        await sock.send_multipart((b"", seq_bytes(start)))
        out: list[tuple[int, bytes]] = []
        while True:
            _, seq, payload = await asyncio.wait_for(sock.recv_multipart(), 10)
            if read_seq(seq) == -1:
                assert payload == b""
                return out
            out.append((read_seq(seq), payload))
    finally:
        sock.close(linger=0)


async def _history_until(ctx: zmq.asyncio.Context, endpoint: str, done: object) -> list[EventBatch]:
    """The replayed history, asked again until ``done(batches)`` holds (the publisher
    sends a step's events on its next turn of the event loop)."""
    assert callable(done)
    for _ in range(1000):
        batches = [decode_batch(p) for _, p in await _replay(ctx, endpoint, 0)]
        if done(batches):
            return batches
        await asyncio.sleep(0)
    raise AssertionError("the publisher never published the expected events")


async def test_blocks_stored_then_evicted_and_replayed(make_sim: SimFactory) -> None:
    sim = await make_sim(models=(LLAMA_8B,), num_gpu_blocks=BLOCKS, kv_events=CONFIG)
    publisher = sim.server.kv_events
    assert publisher is not None
    assert publisher.replay_endpoint is not None
    ctx = zmq.asyncio.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, TOPIC.encode())
    sub.connect(publisher.endpoint)
    try:
        first, second = _prompt("alpha"), _prompt("beta")
        tokens = encode_text(first)
        hashes = block_hashes(tokens, DEFAULT_BLOCK_SIZE)
        await sim.complete(first)

        def stored(batches: list[EventBatch]) -> bool:
            return any(isinstance(e, BlockStored) for b in batches for e in b.events)

        batches = await _history_until(ctx, publisher.replay_endpoint, stored)
        events = [e for b in batches for e in b.events]
        assert isinstance(events[0], BlockStored)
        # The prompt's full blocks in one event (chunked prefill may split it by step),
        # with the emulator's tokens, in order, block 0 without a parent.
        stored_events = [e for e in events if isinstance(e, BlockStored)]
        assert stored_events[0].parent_block_hash is None
        got = tuple(h for e in stored_events for h in e.block_hashes)
        assert got == hashes[: len(got)]
        assert len(got) >= len(tokens) // DEFAULT_BLOCK_SIZE - 1
        assert stored_events[0].token_ids == tokens[: len(stored_events[0].token_ids)]
        assert stored_events[0].block_size == DEFAULT_BLOCK_SIZE

        await sim.complete(second)

        def removed(batches: list[EventBatch]) -> bool:
            return any(isinstance(e, BlockRemoved) for b in batches for e in b.events)

        batches = await _history_until(ctx, publisher.replay_endpoint, removed)
        evicted = {
            h
            for b in batches
            for e in b.events
            if isinstance(e, BlockRemoved)
            for h in e.block_hashes
        }
        assert evicted
        assert evicted <= set(hashes)

        # The live stream carries the same payloads, framed [topic, seq, payload], in order.
        await sim.complete(first)  # more events, whether or not SUB had joined before
        replayed = await _history_until(ctx, publisher.replay_endpoint, stored)
        replayed_payloads = dict(await _replay(ctx, publisher.replay_endpoint, 0))
        assert sorted(replayed_payloads) == list(range(publisher.sequence))
        assert len(replayed) == publisher.sequence
        previous = -1
        while previous < publisher.sequence - 1:
            topic, seq, payload = await asyncio.wait_for(sub.recv_multipart(), 10)
            assert topic == TOPIC.encode()
            number = read_seq(seq)
            assert number > previous
            assert replayed_payloads[number] == payload
            previous = number
    finally:
        sub.close(linger=0)
        ctx.term()


async def test_a_black_holed_host_publishes_nothing_until_the_fault_clears(
    make_sim: SimFactory,
) -> None:
    """The ``black_hole`` fault silences the KV events too (a real host's ZMQ goes quiet
    with the rest of it): what the engine does meanwhile waits and goes out when the
    fault clears, and a replay asked meanwhile is answered then."""
    sim = await make_sim(models=(LLAMA_8B,), num_gpu_blocks=BLOCKS, kv_events=CONFIG)
    publisher = sim.server.kv_events
    assert publisher is not None
    assert publisher.replay_endpoint is not None
    ctx = zmq.asyncio.Context()
    asked = ctx.socket(zmq.DEALER)
    asked.connect(publisher.replay_endpoint)
    try:
        await sim.faults("POST", {"black_hole": True})
        assert publisher.silent
        # What the engine records while silent (its block pool's evictions).
        publisher.add(BlockRemoved(block_hashes=(1,)))
        publisher.add(BlockRemoved(block_hashes=(2,)))
        for _ in range(10):
            await asyncio.sleep(0)  # the publisher's task takes its wake-up
        assert publisher.sequence == 0  # nothing published
        await asked.send_multipart((b"", seq_bytes(0)))
        with pytest.raises(TimeoutError):  # no replay from a silent host
            await asyncio.wait_for(asked.recv_multipart(), 0.3)

        await sim.faults("DELETE")
        assert not publisher.silent
        # The replay asked while silent is answered now, and ends with the end marker.
        while True:
            _, seq, _ = await asyncio.wait_for(asked.recv_multipart(), 10)
            if read_seq(seq) == -1:
                break
        # What waited went out as one batch.
        batches = await _history_until(ctx, publisher.replay_endpoint, lambda b: len(b) == 1)
        assert batches[0].events == (BlockRemoved((1,)), BlockRemoved((2,)))
    finally:
        asked.close(linger=0)
        ctx.term()
