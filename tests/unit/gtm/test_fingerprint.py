import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from gtm.fingerprint import MAX_TEXT_BLOCKS, TEXT_BLOCK_BYTES, text_block_hashes


def test_only_full_blocks_are_hashed() -> None:
    assert text_block_hashes(b"x" * (TEXT_BLOCK_BYTES - 1)) == ()
    assert len(text_block_hashes(b"x" * (3 * TEXT_BLOCK_BYTES + 5))) == 3


def test_hashes_are_prefix_chained() -> None:
    common = b"system prompt " * 100  # > 5 blocks
    a = text_block_hashes(common + b"A" * TEXT_BLOCK_BYTES)
    b = text_block_hashes(common + b"B" * TEXT_BLOCK_BYTES)
    shared = len(common) // TEXT_BLOCK_BYTES
    assert a[:shared] == b[:shared]
    assert a[shared:] != b[shared:]
    # The same block after a different prefix hashes differently (chained on its parent).
    block = b"y" * TEXT_BLOCK_BYTES
    assert (
        text_block_hashes(b"a" * TEXT_BLOCK_BYTES + block)[1]
        != text_block_hashes(b"b" * TEXT_BLOCK_BYTES + block)[1]
    )


def test_limit_and_stability() -> None:
    data = bytes(range(256)) * 40
    assert text_block_hashes(data, limit=4) == text_block_hashes(data)[:4]
    # Stable across processes and versions (BLAKE2b, not Python's salted hash()): a
    # changed value would make every tier's prefix index disagree with the others'.
    assert text_block_hashes(b"\0" * TEXT_BLOCK_BYTES) == (16186692759274953494,)
    assert all(0 <= h < 2**64 for h in text_block_hashes(data))


def _reference(data: bytes, limit: int, block_bytes: int) -> tuple[int, ...]:
    """The chain as its docstring states it, one constructor per block."""
    parent, out = b"\0" * 8, []
    for start in range(0, min(len(data), limit * block_bytes) - block_bytes + 1, block_bytes):
        parent = hashlib.blake2b(parent + data[start : start + block_bytes], digest_size=8).digest()
        out.append(int.from_bytes(parent, "little"))
    return tuple(out)


@settings(max_examples=200, deadline=None)
@given(
    data=st.binary(max_size=3000),
    limit=st.integers(min_value=0, max_value=12),
    block_bytes=st.sampled_from([1, 7, 64, TEXT_BLOCK_BYTES]),
)
def test_the_hashes_are_the_chain_of_each_blocks_blake2b(
    data: bytes, limit: int, block_bytes: int
) -> None:
    assert text_block_hashes(data, limit=limit, block_bytes=block_bytes) == _reference(
        data, limit, block_bytes
    )
    assert text_block_hashes(data) == _reference(data, MAX_TEXT_BLOCKS, TEXT_BLOCK_BYTES)
