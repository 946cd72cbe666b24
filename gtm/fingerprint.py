"""Prompt fingerprints that every tier computes the same way: prefix-chained hashes of
fixed-size blocks of the prompt's UTF-8 text.

A prompt is cut into blocks of :data:`TEXT_BLOCK_BYTES` bytes and each block is hashed
together with its parent's hash (prefix-chained, as vLLM's automatic prefix caching
hashes token blocks), so two prompts share their first ``k`` hashes exactly when they
share their first ``k`` blocks of text. Only *full* blocks are hashed.

Text rather than token ids, deliberately: hashing is one pass of a C hash over the
bytes, while tokenizing with :mod:`gtm.tokens` runs a regex and BPE merges in Python over
the same text, many times the CPU on every request — and routers only need fingerprints
that agree with each other (the zone agent's prefix index, the
zone summaries' prefix sketch and the regional LB's locality scorer). One block is
≈ 64 tokens of English, the block size of Dynamo's KV-router benchmark
(ai-dynamo/dynamo docs/benchmarks/kv-router-ab-testing.md).
"""

from __future__ import annotations

import hashlib

#: Bytes of prompt text per block.
TEXT_BLOCK_BYTES = 256

#: Longest prompt fingerprinted, in blocks (16 MiB of text); request body limits make
#: anything longer impossible anyway.
MAX_TEXT_BLOCKS = 65_536

_ROOT = b"\0" * 8


def text_block_hashes(
    data: bytes, *, limit: int = MAX_TEXT_BLOCKS, block_bytes: int = TEXT_BLOCK_BYTES
) -> tuple[int, ...]:
    """Prefix-chained 64-bit BLAKE2b hashes of the first ``limit`` full blocks of ``data``."""
    parent = _ROOT
    out: list[int] = []
    blake2b = hashlib.blake2b
    end = min(len(data), limit * block_bytes) - block_bytes + 1
    for start in range(0, end, block_bytes):
        parent = blake2b(parent + data[start : start + block_bytes], digest_size=8).digest()
        out.append(int.from_bytes(parent, "little"))
    return tuple(out)
