"""The sans-io half of the zone agent's KV-event source: events change the prefix index
the decision reads (no sockets here; the ZeroMQ side: tests/integration/zone_agent)."""

from __future__ import annotations

import json

import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from gtm.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from gtm.models import GpuWorker
from gtm.tokens import block_hashes, encode_chat, encode_text, parse_chat_messages
from zone_agent.config import KVEventsSource
from zone_agent.kv_events import (
    EngineBlocks,
    EvictingDictPrefixIndex,
    EvictingPrefixIndex,
    KVEventMetrics,
    KVEventSource,
    engine_tokens,
)
from zone_agent.prefix import DictPrefixIndex
from zone_agent.request import Endpoint

BS = 4
TOKENS = tuple(range(100, 124))  # 6 token blocks
KEYS = block_hashes(TOKENS, BS)
TEXT = (11, 12, 13)  # 3 text blocks: end in token blocks 1, 3, 5


Setup = tuple[EvictingPrefixIndex | EvictingDictPrefixIndex, KVEventSource]


def _batch(*events: BlockStored | BlockRemoved | AllBlocksCleared) -> EventBatch:
    return EventBatch(ts=0.0, events=events)


@pytest.fixture(params=[EvictingPrefixIndex, EvictingDictPrefixIndex])
def setup(request: pytest.FixtureRequest) -> Setup:
    engine = EngineBlocks()
    index = request.param(engine)
    source = KVEventSource(engine)
    source.sent(TOKENS, BS, TEXT)
    return index, source


def test_without_events_the_index_is_the_agents_record(setup: Setup) -> None:
    index, _ = setup
    plain = DictPrefixIndex()
    for slot, hashes in ((0, TEXT), (1, TEXT[:2]), (2, (99,))):
        index.insert(slot, hashes, 100)
        plain.insert(slot, hashes, 100)
    for probe in (TEXT, TEXT[:1], (99, 1), (), (5,)):
        assert index.match_groups(probe) == plain.match_groups(probe)


def test_eviction_takes_text_blocks_out_and_sending_again_puts_them_back(setup: Setup) -> None:
    index, source = setup
    index.insert(0, TEXT, 100)
    engine_hashes = tuple(1000 + i for i in range(6))  # the engine's own (opaque) hashes
    source.apply(0, _batch(BlockStored(engine_hashes, None, TOKENS, BS)))
    assert index.match_groups(TEXT) == [(3, 1)]
    # Tail first, as vLLM evicts: token block 5 ends text block 2; block 3 ends text 1.
    source.apply(0, _batch(BlockRemoved((engine_hashes[5],))))
    assert index.match_groups(TEXT) == [(2, 1)]
    source.apply(0, _batch(BlockRemoved((engine_hashes[4], engine_hashes[3]))))
    assert index.match_groups(TEXT) == [(1, 1)]
    index.insert(0, TEXT, 100)  # the agent sends the prompt there again
    assert index.match_groups(TEXT) == [(3, 1)]


def test_a_prompt_another_router_sent_counts(setup: Setup) -> None:
    index, source = setup
    assert index.match_groups(TEXT) == []
    # Stored in two events, the second chained to the first by the engine's parent hash.
    source.apply(2, _batch(BlockStored((1, 2, 3), None, TOKENS[:12], BS)))
    assert index.match_groups(TEXT) == [(1, 1 << 2)]
    source.apply(2, _batch(BlockStored((4, 5, 6), 3, TOKENS[12:], BS)))
    assert index.match_groups(TEXT) == [(3, 1 << 2)]
    # A parent the agent never heard of: the blocks cannot be keyed (an orphan).
    assert source.apply(1, _batch(BlockStored((7,), 42, TOKENS[:4], BS))).orphans == 1
    source.apply(2, _batch(AllBlocksCleared()))
    assert index.match_groups(TEXT) == []


def test_a_stale_stream_falls_back_to_the_agents_record(setup: Setup) -> None:
    index, source = setup
    index.insert(0, TEXT, 100)
    source.apply(0, _batch(BlockStored((1, 2, 3, 4, 5, 6), None, TOKENS, BS)))
    source.apply(0, _batch(BlockRemoved((1, 2, 3, 4, 5, 6))))
    source.apply(1, _batch(BlockStored((1, 2, 3, 4, 5, 6), None, TOKENS, BS)))
    assert index.match_groups(TEXT) == [(3, 1 << 1)]
    source.stale(0)
    assert index.match_groups(TEXT) == [(3, 0b11)]
    source.stale(1)
    assert index.match_groups(TEXT) == [(3, 0b01)]


@pytest.mark.parametrize("form", [EvictingPrefixIndex, EvictingDictPrefixIndex])
def test_each_match_is_counted_by_its_path(
    form: type[EvictingPrefixIndex | EvictingDictPrefixIndex],
) -> None:
    registry = CollectorRegistry()
    engine = EngineBlocks()
    index = form(engine, KVEventMetrics(registry).prefix_matches)
    source = KVEventSource(engine)
    source.sent(TOKENS, BS, TEXT)

    def count(path: str) -> float | None:
        return registry.get_sample_value("gtm_zone_prefix_matches_total", {"path": path})

    index.insert(0, TEXT, 100)
    assert index.match_groups(TEXT) == [(3, 1)]  # the engines said nothing yet
    assert (count("compiled"), count("engine-overlay")) == (1.0, 0.0)
    source.apply(0, _batch(BlockStored((1, 2, 3, 4, 5, 6), None, TOKENS, BS)))
    index.match_groups(TEXT)
    index.match_groups((99,))  # blocks no engine spoke of
    assert (count("compiled"), count("engine-overlay")) == (2.0, 1.0)


def test_token_blocks_map_to_text_blocks_in_proportion() -> None:
    engine = EngineBlocks()
    source = KVEventSource(engine)
    index = EvictingDictPrefixIndex(engine)
    text = tuple(range(50, 60))  # 10 text blocks over 6 token blocks
    source.sent(TOKENS, BS, text)
    source.apply(0, _batch(BlockStored((1, 2, 3), None, TOKENS[:12], BS)))
    # Text block i ends in token block ceil((i+1)*6/10) - 1: blocks 0..4 end in 0..2.
    assert index.match_groups(text) == [(5, 1)]


def test_engine_tokens_are_the_emulators() -> None:
    messages = [{"role": "user", "content": "hello there"}]
    chat = json.dumps({"model": "m", "messages": messages}).encode()
    assert engine_tokens(chat, Endpoint.CHAT) == encode_chat(parse_chat_messages(messages))
    text = json.dumps({"model": "m", "prompt": "hello there"}).encode()
    assert engine_tokens(text, Endpoint.COMPLETION) == encode_text("hello there")
    several = json.dumps({"model": "m", "prompt": ["a b", "c"]}).encode()
    assert engine_tokens(several, Endpoint.COMPLETION) == encode_text("a b")
    ids = json.dumps({"model": "m", "prompt": [1, 2, 3]}).encode()
    assert engine_tokens(ids, Endpoint.COMPLETION) == (1, 2, 3)
    for bad in (b"{", b"[]", b'{"messages": 3}', b'{"prompt": 3}'):
        assert engine_tokens(bad, Endpoint.CHAT) == ()
        assert engine_tokens(bad, Endpoint.COMPLETION) == ()


def _worker(url: str, *labels: tuple[str, str]) -> GpuWorker:
    return GpuWorker(
        id="g", zone_id="z", region_id="r", url=url, gpu_type="H100", models=(), labels=labels
    )


def test_endpoints_from_patterns_and_labels() -> None:
    source = KVEventsSource(replay="tcp://{host}:{port}9")
    assert source.endpoints(_worker("http://10.0.0.5:8000")) == (
        "tcp://10.0.0.5:5557",
        "tcp://10.0.0.5:80009",
    )
    assert KVEventsSource().endpoints(_worker("https://[::1]")) == ("tcp://[::1]:5557", None)
    labelled = _worker("http://h:1", ("kv-events", "tcp://e:1"), ("kv-events-replay", "tcp://e:2"))
    assert source.endpoints(labelled) == ("tcp://e:1", "tcp://e:2")
    for bad in ("tcp://{hostname}:1", "http://{host}:1", "tcp://{0}:1"):
        with pytest.raises(ValidationError):
            KVEventsSource(endpoint=bad)


def test_deferred_prompts_are_tokenized_once_when_events_come() -> None:
    engine = EngineBlocks()
    source = KVEventSource(engine)
    index = EvictingDictPrefixIndex(engine)
    calls: list[int] = []

    def tokens() -> tuple[int, ...]:
        calls.append(1)
        return TOKENS

    for _ in range(3):  # the same prompt three times (retries, n > 1, a repeat)
        source.defer(tokens, BS, TEXT)
    assert calls == []  # nothing on the request's path
    source.apply(1, _batch(BlockStored(KEYS, None, TOKENS, BS)))
    assert calls == [1]
    assert index.match_groups(TEXT) == [(3, 1 << 1)]


def test_gtm_zone_names_a_bad_kv_events_pattern() -> None:
    from click.testing import CliRunner

    from zone_agent.cli import zone

    base = ["--zone", "z", "--region", "r", "--worker", "http://127.0.0.1:1"]
    for flags in (
        ["--kv-events", "http://{host}:5557"],
        ["--kv-events-replay", "tcp://{x}:1", "--kv-events"],
    ):
        result = CliRunner().invoke(zone, [*base, *flags])
        assert result.exit_code == 2, result.output
        assert "--kv-events" in result.output
