"""The emulator's KV-event recorder: the block pool's registrations and evictions become
vLLM's events, a prompt's consecutive blocks one BlockStored (no sockets here)."""

from __future__ import annotations

from gpusim.kv_events import KVEventPublisher
from gpusim.prefix_cache import BlockPool
from gtm.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventsConfig
from gtm.metrics import new_registry


def _publisher(**options: object) -> KVEventPublisher:
    config = KVEventsConfig.model_validate({"enable_kv_cache_events": True, **options})
    return KVEventPublisher(config, registry=new_registry())


def test_pool_changes_become_vllm_events() -> None:
    publisher = _publisher()
    recorder = publisher.recorder(block_size=2)
    pool = BlockPool(3)
    pool.listener = recorder
    recorder.note_prompt([1, 2, 3, 4, 5], [11, 12])  # two full blocks (the 5 is partial)
    blocks = pool.allocate(3)
    assert blocks is not None
    pool.register(blocks[0], 11)
    pool.register(blocks[1], 12)
    pool.register(blocks[2], 12)  # a private copy of a cached block: no event
    assert publisher._pending == [
        BlockStored(
            block_hashes=(11, 12), parent_block_hash=None, token_ids=(1, 2, 3, 4), block_size=2
        )
    ]
    publisher._pending.clear()
    pool.release(blocks)
    recorder.note_prompt([9, 9], [21])
    again = pool.allocate(2)  # the free block, then the least recent cached: 12 (a tail)
    assert again is not None
    pool.register(again[0], 21)
    assert publisher._pending == [
        BlockRemoved(block_hashes=(12,)),
        BlockStored(block_hashes=(21,), parent_block_hash=None, token_ids=(9, 9), block_size=2),
    ]
    publisher._pending.clear()
    pool.release(again)
    pool.reset()
    assert publisher._pending == [AllBlocksCleared()]


def test_a_full_queue_drops_the_oldest() -> None:
    publisher = _publisher(max_queue_size=2)
    for block in (1, 2, 3):
        publisher.add(BlockRemoved(block_hashes=(block,)))
    assert publisher._pending == [BlockRemoved((2,)), BlockRemoved((3,))]
