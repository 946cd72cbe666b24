"""vLLM's KV-cache events on the wire: the configuration, the ZMQ framing, the msgpack
payloads, and a tolerant decoder. Shared by the emulator that publishes them
(:mod:`gpusim.kv_events`) and the zone agent that reads them (:mod:`zone_agent.kv_events`).

Sources (vllm-project/vllm): ``vllm/config/kv_events.py`` (``KVEventsConfig``, the JSON of
``--kv-events-config``), ``vllm/distributed/kv_events.py`` (the event structs and
``ZmqEventPublisher``), ``examples/online_serving/kv_events_subscriber.py``.

Framing (``ZmqEventPublisher._publisher_thread``)
    A PUB socket sends one three-frame message per engine step that changed the cache:
    ``[topic, seq, payload]`` — ``topic`` the configured string in UTF-8 (default empty),
    ``seq`` an 8-byte big-endian unsigned counter from 0, ``payload`` one msgpack-encoded
    ``KVEventBatch``. The endpoint is bound when it contains ``*`` or ``::`` or is
    ``ipc://``/``inproc://``, connected otherwise (:func:`binds`).

Replay (``ZmqEventPublisher._service_replay``)
    An optional ROUTER socket keeps the last ``buffer_steps`` payloads. A client sends the
    first sequence number it wants (8 bytes, big-endian) behind an empty delimiter frame
    (what a REQ socket adds); the ROUTER answers one ``[seq, payload]`` message per buffered
    batch from there on and ends with ``[END_SEQ, b""]`` (``END_SEQ`` is -1 as 8 signed
    bytes). vLLM PR #45177 adds the topic as a first frame of each answer; the decoder
    here accepts both.

Payloads: ``msgspec.msgpack`` of msgspec structs, ``omit_defaults=True``, ``tag=True``
    (the tag is the class name). ``KVEventBatch`` is ``[ts, events, data_parallel_rank]``
    — an array; the publisher fills the rank (0 without data parallelism). Two encodings
    of the events exist (:class:`KVEventEncoding`):

    * ``map`` (the default: current vLLM) — vLLM PR #42892 (merged 2026-06) dropped
      ``array_like`` from the event structs: each event is a map with the tag under
      ``"type"`` and its fields by name, the batch stays an array (a vLLM 0.26 capture
      in volcano-sh/kthena#1535). llm-d's indexer, Dynamo and the vllm-router release
      on PyPI decode it.
    * ``array`` — vLLM up to 0.23: every event is a positional array whose first element
      is the tag, e.g. ``["BlockStored", block_hashes, parent_block_hash, token_ids,
      block_size, lora_id, medium, lora_name, extra_keys, group_idx, ...]`` (msgspec
      writes an array-like struct's defaulted fields too). Older consumers decode only
      this (vllm-project/router ``src/kv_events/decoder.rs`` at one point required 8
      positional fields of a ``BlockStored``).

Block hashes
    vLLM hashes block ``i`` as ``H((parent_hash, token_ids_of_block, extra_keys))`` with
    ``H`` one of ``--prefix-caching-hash-algo`` (``sha256`` over pickle, ``sha256_cbor``
    over canonical CBOR, ...) and block 0's parent ``NONE_HASH`` (a seed from
    ``PYTHONHASHSEED``, random when unset) — ``vllm/v1/core/kv_cache_utils.py``. The
    published ``block_hashes`` are the engine's own (an int, or the low 8 bytes of the
    digest as an int: ``ExternalBlockHash``), so consumers do not reproduce them. They
    hash the event's ``token_ids`` again with their own function and keep the engine
    hash only to apply a later ``BlockRemoved``: llm-d (llm-d/llm-d-kv-cache
    ``pkg/kvcache/kvblock/token_processor.go``: FNV-64a over canonical CBOR of
    ``[parent, tokens, extra]``, chained from a seed), vllm-router
    (``src/kv_index/local_hash.rs``: SHA-256 of each block's tokens), Dynamo (ai-dynamo/
    dynamo ``lib/kv-router``: XXH3-64, seed 1337, of each block's little-endian u32
    tokens, walked in a radix tree where the engine's hash is an opaque id). Each scores
    a worker by the longest run of the prompt's leading blocks it holds. A router
    therefore needs the engine's *tokenization* of a prompt, never its hash seed. gtm
    does the same (:mod:`zone_agent.kv_events`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

import msgspec
from pydantic import Field, model_validator

from gtm.errors import GtmError
from gtm.models import Frozen

#: vLLM's ``ZmqEventPublisher.END_SEQ``: the sequence frame that ends a replay answer.
END_SEQ = (-1).to_bytes(8, "big", signed=True)

#: The ``medium`` of a block in GPU memory (``vllm.distributed.kv_events.MEDIUM_GPU``).
MEDIUM_GPU = "GPU"

#: ``kv_cache_spec_kind`` of a full-attention cache group (vLLM PR #40984).
FULL_ATTENTION = "full_attention"


class KVEventEncoding(StrEnum):
    """How the events inside a batch are encoded (see the module docstring)."""

    #: Positional arrays, tag first (vLLM up to 0.23).
    ARRAY = "array"
    #: Maps with the tag under ``"type"`` (vLLM after PR #42892: current vLLM).
    MAP = "map"


class KVEventsConfig(Frozen):
    """vLLM's ``KVEventsConfig`` (the JSON of ``--kv-events-config``), same fields and
    defaults, plus gtm's ``encoding`` (which vLLM release's payloads to reproduce)."""

    enable_kv_cache_events: bool = False
    #: ``None`` means ``"zmq"`` when events are enabled, ``"null"`` otherwise (vLLM's
    #: ``__post_init__``).
    publisher: Literal["null", "zmq"] | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = Field(default=10_000, ge=1)
    hwm: int = Field(default=100_000, ge=0)
    max_queue_size: int = Field(default=100_000, ge=1)
    topic: str = ""
    encoding: KVEventEncoding = KVEventEncoding.MAP

    @model_validator(mode="after")
    def _default_publisher(self) -> KVEventsConfig:
        if self.publisher is None:
            object.__setattr__(self, "publisher", "zmq" if self.enable_kv_cache_events else "null")
        return self

    @property
    def publishing(self) -> bool:
        """Whether events go out at all (vLLM's ``EventPublisherFactory.create``)."""
        return self.enable_kv_cache_events and self.publisher == "zmq"


def binds(endpoint: str) -> bool:
    """vLLM's heuristic: bind a wildcard, IPv6-any or ipc/inproc endpoint, connect others."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


#: Worker labels that name a worker's own KV-event endpoints: the zone agent dials them
#: over its ``--kv-events`` patterns, and ``gtm gpu-sim`` registers them.
KV_EVENTS_LABEL = "kv-events"
KV_EVENTS_REPLAY_LABEL = "kv-events-replay"


def endpoint_labels(config: KVEventsConfig, host: str) -> tuple[tuple[str, str], ...]:
    """The ``kv-events``/``kv-events-replay`` labels a publisher reachable at ``host``
    registers: a bound ``tcp://*:PORT`` becomes ``tcp://HOST:PORT``, an ipc:// path is
    itself; an endpoint it connects out of (or inproc://) names nothing a subscriber dials."""
    if not config.publishing:
        return ()
    named = ((KV_EVENTS_LABEL, config.endpoint), (KV_EVENTS_REPLAY_LABEL, config.replay_endpoint))
    bracketed = f"[{host}]" if ":" in host else host
    labels = []
    for label, endpoint in named:
        if endpoint is None or not binds(endpoint) or endpoint.startswith("inproc://"):
            continue
        labels.append((label, endpoint.replace("tcp://*", f"tcp://{bracketed}", 1)))
    return tuple(labels)


# ---------------------------------------------------------------------------- payloads
# vLLM's event layouts field for field, in declaration order — (name, type) or (name,
# type, default) — built as msgspec structs in both encodings, so msgspec (the encoder
# vLLM itself uses) writes the same bytes vLLM does.

_STORED_FIELDS_LAYOUT: tuple[tuple[Any, ...], ...] = (
    ("block_hashes", list[int]),
    ("parent_block_hash", int | None),
    ("token_ids", list[int]),
    ("block_size", int),
    ("lora_id", int | None),
    ("medium", str | None),
    ("lora_name", str | None),
    ("extra_keys", list[Any] | None, None),
    ("group_idx", int | None, None),
    ("kv_cache_spec_kind", str | None, None),
    ("kv_cache_spec_sliding_window", int | None, None),
)
_REMOVED_FIELDS_LAYOUT: tuple[tuple[Any, ...], ...] = (
    ("block_hashes", list[int]),
    ("medium", str | None),
    ("group_idx", int | None, None),
)


def _event_structs(*, array_like: bool) -> tuple[type[msgspec.Struct], ...]:
    """(BlockStored, BlockRemoved, AllBlocksCleared) as vLLM's ``KVCacheEvent``
    subclasses: ``array_like`` before vLLM PR #42892, maps (tag under ``"type"``) after."""
    return tuple(
        msgspec.defstruct(tag, fields, tag=tag, array_like=array_like, omit_defaults=True, gc=False)
        for tag, fields in (
            ("BlockStored", _STORED_FIELDS_LAYOUT),
            ("BlockRemoved", _REMOVED_FIELDS_LAYOUT),
            ("AllBlocksCleared", ()),
        )
    )


ArrayBlockStored, ArrayBlockRemoved, ArrayAllBlocksCleared = _event_structs(array_like=True)
MapBlockStored, MapBlockRemoved, MapAllBlocksCleared = _event_structs(array_like=False)


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """vLLM's ``KVEventBatch``: ``[ts, events, data_parallel_rank]``."""

    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


# ---------------------------------------------------------------------------- decoded


class KVEventDecodeError(GtmError, ValueError):
    """A KV-event message or payload is not one vLLM would send; the message says why."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Blocks the engine cached: ``block_hashes[i]`` holds ``token_ids[i*bs:(i+1)*bs]``,
    and block 0's parent is ``parent_block_hash`` (``None``: the prompt's first block)."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_name: str | None = None
    medium: str | None = MEDIUM_GPU


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks the engine evicted."""

    block_hashes: tuple[int, ...]
    medium: str | None = MEDIUM_GPU


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The engine dropped its whole prefix cache (a reset, a model reload)."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One decoded payload."""

    ts: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None = None


def encode_batch(
    ts: float,
    events: list[KVEvent],
    *,
    encoding: KVEventEncoding = KVEventEncoding.MAP,
    data_parallel_rank: int | None = 0,
) -> bytes:
    """The msgpack payload vLLM would publish for ``events`` in ``encoding``."""
    array = encoding is KVEventEncoding.ARRAY
    wire: list[Any] = []
    for event in events:
        if isinstance(event, BlockStored):
            stored = ArrayBlockStored if array else MapBlockStored
            wire.append(
                stored(
                    block_hashes=list(event.block_hashes),
                    parent_block_hash=event.parent_block_hash,
                    token_ids=list(event.token_ids),
                    block_size=event.block_size,
                    lora_id=None,
                    medium=event.medium,
                    lora_name=event.lora_name,
                    # Current vLLM (the map era) sends one extra_keys entry per block,
                    # the group and its kind (volcano-sh/kthena#1535's capture).
                    extra_keys=None if array else [None] * len(event.block_hashes),
                    group_idx=None if array else 0,
                    kv_cache_spec_kind=None if array else FULL_ATTENTION,
                )
            )
        elif isinstance(event, BlockRemoved):
            removed = ArrayBlockRemoved if array else MapBlockRemoved
            wire.append(
                removed(
                    block_hashes=list(event.block_hashes),
                    medium=event.medium,
                    group_idx=None if array else 0,
                )
            )
        else:
            wire.append(ArrayAllBlocksCleared() if array else MapAllBlocksCleared())
    return msgspec.msgpack.encode(
        KVEventBatch(ts=ts, events=wire, data_parallel_rank=data_parallel_rank)
    )


def _int_list(value: object, field: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise KVEventDecodeError(f"{field} must be an array")
    for item in value:
        if type(item) is not int:
            raise KVEventDecodeError(f"{field} must hold integers")
    return tuple(value)


def _hash_list(value: object, field: str) -> tuple[int, ...]:
    """Engine hashes: ints, or digests as bytes (vLLM's ``ExternalBlockHash``), which
    are read as their low 8 bytes, big-endian."""
    if not isinstance(value, list):
        raise KVEventDecodeError(f"{field} must be an array")
    return tuple(_hash(item, field) for item in value)


def _hash(item: object, field: str) -> int:
    if type(item) is int:
        return item & 0xFFFF_FFFF_FFFF_FFFF
    if isinstance(item, bytes) and item:
        return int.from_bytes(item[-8:], "big")
    raise KVEventDecodeError(f"{field} must hold integers or bytes")


_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size")


def _event(raw: object) -> KVEvent:
    if isinstance(raw, dict):
        tag = raw.get("type")
        fields: dict[str, object] = raw
    elif isinstance(raw, list) and raw:
        tag = raw[0]
        names: tuple[str, ...]
        if tag == "BlockStored":
            names = (*_STORED_FIELDS, "lora_id", "medium", "lora_name")
        elif tag == "BlockRemoved":
            names = ("block_hashes", "medium")
        else:
            names = ()
        fields = dict(zip(names, raw[1:], strict=False))
    else:
        raise KVEventDecodeError("an event must be a tagged array or map")
    if tag == "BlockStored":
        missing = [name for name in _STORED_FIELDS if name not in fields]
        if missing:
            raise KVEventDecodeError(f"BlockStored lacks {', '.join(missing)}")
        parent = fields["parent_block_hash"]
        size = fields["block_size"]
        if type(size) is not int or size < 1:
            raise KVEventDecodeError("BlockStored.block_size must be a positive integer")
        lora = fields.get("lora_name")
        medium = fields.get("medium")
        return BlockStored(
            block_hashes=_hash_list(fields["block_hashes"], "BlockStored.block_hashes"),
            parent_block_hash=None if parent is None else _hash(parent, "parent_block_hash"),
            token_ids=_int_list(fields["token_ids"], "BlockStored.token_ids"),
            block_size=size,
            lora_name=lora if isinstance(lora, str) else None,
            medium=medium if isinstance(medium, str) else None,
        )
    if tag == "BlockRemoved":
        if "block_hashes" not in fields:
            raise KVEventDecodeError("BlockRemoved lacks block_hashes")
        medium = fields.get("medium")
        return BlockRemoved(
            block_hashes=_hash_list(fields["block_hashes"], "BlockRemoved.block_hashes"),
            medium=medium if isinstance(medium, str) else None,
        )
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise KVEventDecodeError(f"unknown event type {tag!r}")


def decode_batch(payload: bytes) -> EventBatch:
    """A payload in either encoding (and either batch shape: vLLM's array, or a map with
    ``ts``/``events``); :class:`KVEventDecodeError` when it is not one."""
    try:
        raw = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError as exc:
        raise KVEventDecodeError(f"not msgpack: {exc}") from None
    if isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif isinstance(raw, list) and len(raw) >= 2:
        ts, events = raw[0], raw[1]
        rank = raw[2] if len(raw) > 2 else None
    else:
        raise KVEventDecodeError("a batch must be [ts, events, data_parallel_rank]")
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        raise KVEventDecodeError("a batch's ts must be a number")
    if not isinstance(events, list):
        raise KVEventDecodeError("a batch's events must be an array")
    return EventBatch(
        ts=float(ts),
        events=tuple(_event(item) for item in events),
        data_parallel_rank=rank if type(rank) is int else None,
    )


def seq_bytes(seq: int) -> bytes:
    """A sequence number as its frame: 8 bytes, big-endian."""
    return seq.to_bytes(8, "big")


def read_seq(frame: bytes) -> int:
    """A sequence frame as a number: -1 for :data:`END_SEQ`; :class:`KVEventDecodeError`
    when it is not 8 bytes."""
    if len(frame) != 8:
        raise KVEventDecodeError(f"a sequence frame has 8 bytes, not {len(frame)}")
    return int.from_bytes(frame, "big", signed=frame == END_SEQ)
