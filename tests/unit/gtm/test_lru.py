import pytest

from gtm.lru import LruCache


def test_keeps_the_most_recently_used_entries() -> None:
    cache: LruCache[int, str] = LruCache(3)
    for k in range(3):
        cache.put(k, str(k))
    assert cache.get(0) == "0"  # 0 is now the most recent; 1 the least
    cache.put(3, "3")
    assert len(cache) == 3
    assert cache.get(1) is None
    assert [cache.get(k) for k in (0, 2, 3)] == ["0", "2", "3"]
    cache.put(2, "two")  # an update is a use
    cache.put(4, "4")
    assert cache.get(0) is None
    assert cache.get(2) == "two"


def test_a_stream_of_new_keys_never_grows_it_past_its_capacity() -> None:
    cache: LruCache[int, int] = LruCache(100)
    for k in range(10_000):
        cache.put(k, k)
        assert len(cache) == min(k + 1, 100)
    assert cache.get(9_999) == 9_999
    assert cache.get(9_899) is None
    assert cache.capacity == 100


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        LruCache(0)
