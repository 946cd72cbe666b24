"""vLLM's KV-event structs in the array era, copied field for field from vllm-project/vllm
``vllm/distributed/kv_events.py`` (``array_like=True``; ``lora_name`` from PR #27577,
``extra_keys``/``group_idx``/``kv_cache_spec_*`` from #33304, #37688, #40984; the last
form before PR #42892). Module-level classes, as in vLLM: msgspec tags a struct with
its qualified name."""

from __future__ import annotations

from typing import Any

import msgspec


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base class for all KV cache-related events"""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass
