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
import struct

#: Bytes of prompt text per block.
TEXT_BLOCK_BYTES = 256

#: Longest prompt fingerprinted, in blocks (16 MiB of text); request body limits make
#: anything longer impossible anyway.
MAX_TEXT_BLOCKS = 65_536

_DIGEST_BYTES = 8
_ROOT = b"\0" * _DIGEST_BYTES


def text_block_hashes(
    data: bytes, *, limit: int = MAX_TEXT_BLOCKS, block_bytes: int = TEXT_BLOCK_BYTES
) -> tuple[int, ...]:
    """Prefix-chained 64-bit BLAKE2b hashes of the first ``limit`` full blocks of ``data``.

    Each block's hash is ``blake2b(parent + block, digest_size=8)``, read as a
    little-endian integer. The hasher is set up once and copied per block (a copy skips
    the constructor's parameter parsing), and the digests are read as integers all at
    once."""
    end = min(len(data), limit * block_bytes) - block_bytes + 1
    if end <= 0:
        return ()
    new = hashlib.blake2b(digest_size=_DIGEST_BYTES).copy
    parent = _ROOT
    digests: list[bytes] = []
    for start in range(0, end, block_bytes):
        block = new()
        block.update(parent)
        block.update(data[start : start + block_bytes])
        parent = block.digest()
        digests.append(parent)
    return struct.unpack(f"<{len(digests)}Q", b"".join(digests))
