"""vLLM's KV-event wire format (gtm.kv_events), pinned against vLLM's own class layouts.

vLLM is not installed here, so its classes are copied field for field from
vllm-project/vllm ``vllm/distributed/kv_events.py`` into two modules beside this one: the
array era (``vllm_kv_events_array``) and the map era (``vllm_kv_events_map``). Encoded
with msgspec (vLLM's own encoder), they must give exactly the
bytes gtm's encoder writes; a literal fixture, checked by hand against the msgpack spec,
pins the array form independently of msgspec.
"""

from __future__ import annotations

import msgspec
import pytest

from gtm.kv_events import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventDecodeError,
    KVEventEncoding,
    KVEventsConfig,
    binds,
    decode_batch,
    encode_batch,
    read_seq,
    seq_bytes,
)
from tests.unit.gtm import vllm_kv_events_array as VllmArray
from tests.unit.gtm import vllm_kv_events_map as VllmMap

HASH = 0xD5A1_0000_0000_0001  # above 2**63: must go out as uint64
EVENTS: list[KVEvent] = [
    BlockStored(
        block_hashes=(HASH, 7), parent_block_hash=None, token_ids=(1, 2, 3, 4), block_size=2
    ),
    BlockRemoved(block_hashes=(HASH,)),
    AllBlocksCleared(),
]


def test_array_encoding_is_vllms_bytes() -> None:
    vllm = VllmArray
    expected = msgspec.msgpack.encode(
        vllm.EventBatch(
            ts=12.5,
            events=[
                vllm.BlockStored([HASH, 7], None, [1, 2, 3, 4], 2, None, "GPU", None),
                vllm.BlockRemoved([HASH], "GPU"),
                vllm.AllBlocksCleared(),
            ],
            data_parallel_rank=0,
        )
    )
    assert encode_batch(12.5, EVENTS, encoding=KVEventEncoding.ARRAY) == expected


def test_map_encoding_is_vllms_bytes() -> None:
    vllm = VllmMap
    expected = msgspec.msgpack.encode(
        VllmArray.EventBatch(
            ts=12.5,
            events=[
                vllm.BlockStored(
                    [HASH, 7],
                    None,
                    [1, 2, 3, 4],
                    2,
                    None,
                    "GPU",
                    None,
                    extra_keys=[None, None],
                    group_idx=0,
                    kv_cache_spec_kind="full_attention",
                ),
                vllm.BlockRemoved([HASH], "GPU", group_idx=0),
                vllm.AllBlocksCleared(),
            ],
            data_parallel_rank=0,
        )
    )
    assert encode_batch(12.5, EVENTS, encoding=KVEventEncoding.MAP) == expected


def test_array_encoding_literal_bytes() -> None:
    # [1.5, [["BlockStored", [1], nil, [7, 8], 2, nil, "GPU", nil, nil, nil, nil, nil]], 0]
    # by the msgpack spec: fixarray 3; float 64; fixarray 1; fixarray 12; fixstr 11;
    # fixarray 1, 1; nil; fixarray 2, 7, 8; 2; nil (lora_id); fixstr 3 "GPU"; nil
    # (lora_name); 4 × nil (extra_keys, group_idx, kv_cache_spec_*: msgspec writes
    # defaults of an array-like struct, omit_defaults only trims maps); 0 (the rank).
    expected = bytes.fromhex(
        "93" "cb3ff8000000000000" "91" "9c" "ab" + b"BlockStored".hex()
        + "9101" "c0" "920708" "02" "c0" "a3" + b"GPU".hex() + "c0" "c0c0c0c0" "00"
    )  # fmt: skip
    event = BlockStored(block_hashes=(1,), parent_block_hash=None, token_ids=(7, 8), block_size=2)
    assert encode_batch(1.5, [event], encoding=KVEventEncoding.ARRAY) == expected
    assert decode_batch(expected).events == (event,)


def test_vllm_router_reads_eight_fields_of_block_stored() -> None:
    # vllm-project/router src/kv_events/decoder.rs: "expected >= 8 fields".
    raw = msgspec.msgpack.decode(encode_batch(1.0, EVENTS[:1], encoding=KVEventEncoding.ARRAY))
    assert raw[1][0][0] == "BlockStored"
    assert len(raw[1][0]) >= 8
    assert raw[1][0][1] == [HASH, 7]


@pytest.mark.parametrize("encoding", list(KVEventEncoding))
def test_round_trip(encoding: KVEventEncoding) -> None:
    batch = decode_batch(encode_batch(3.0, EVENTS, encoding=encoding))
    assert batch.ts == 3.0
    assert batch.data_parallel_rank == 0
    assert batch.events == tuple(EVENTS)


def test_decodes_old_vllm_without_medium_and_bytes_hashes() -> None:
    # vLLM's first release of the events: [tag, hashes, parent, tokens, size, lora_id].
    payload = msgspec.msgpack.encode(
        [1.0, [["BlockStored", [b"\x00" * 24 + (5).to_bytes(8, "big")], 9, [1, 2], 2, None]]]
    )
    (event,) = decode_batch(payload).events
    assert event == BlockStored(
        block_hashes=(5,), parent_block_hash=9, token_ids=(1, 2), block_size=2, medium=None
    )


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",  # never used in msgpack
        msgspec.msgpack.encode("hello"),
        msgspec.msgpack.encode([1.0]),
        msgspec.msgpack.encode(["x", []]),
        msgspec.msgpack.encode([1.0, [["Nope"]]]),
        msgspec.msgpack.encode([1.0, [["BlockStored", [1]]]]),
        msgspec.msgpack.encode([1.0, [["BlockStored", ["a"], None, [1], 1, None]]]),
        msgspec.msgpack.encode([1.0, [["BlockStored", [1], None, [1], 0, None]]]),
        msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved"}]]),
        msgspec.msgpack.encode([1.0, [7]]),
    ],
)
def test_garbage_is_a_decode_error(payload: bytes) -> None:
    with pytest.raises(KVEventDecodeError):
        decode_batch(payload)


def test_sequence_frames() -> None:
    assert seq_bytes(1) == b"\x00" * 7 + b"\x01"
    assert read_seq(seq_bytes(2**40)) == 2**40
    assert read_seq(END_SEQ) == -1
    with pytest.raises(KVEventDecodeError):
        read_seq(b"\x01")


def test_config_is_vllms() -> None:
    assert KVEventsConfig().publisher == "null"
    config = KVEventsConfig.model_validate({"enable_kv_cache_events": True, "topic": "kv"})
    assert config.publisher == "zmq"
    assert config.publishing
    assert config.endpoint == "tcp://*:5557"
    assert config.buffer_steps == 10_000
    assert config.encoding is KVEventEncoding.MAP  # what current vLLM sends
    assert not KVEventsConfig(enable_kv_cache_events=True, publisher="null").publishing
    assert binds("tcp://*:5557")
    assert binds("ipc:///tmp/kv")
    assert not binds("tcp://10.0.0.1:5557")
