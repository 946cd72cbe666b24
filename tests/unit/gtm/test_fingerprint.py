from gtm.fingerprint import TEXT_BLOCK_BYTES, text_block_hashes


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
