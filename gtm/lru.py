"""A mapping that keeps its most recently used entries: the bound for caches whose keys
come from clients.

A cache keyed by something a client chooses (its address, its prompt) grows by one
entry per new client unless it is bounded; "cleared when full" at a large size is a
bound, but one a long-running process reaches only after hours, growing all the while,
and then loses everything at once. :class:`LruCache` keeps the ``capacity`` entries used
last and drops the least recently used one per insertion beyond it, so a process's
memory for the cache is flat once it has seen ``capacity`` distinct keys, and repeat
keys (the clients that come back) stay.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LruCache(Generic[K, V]):
    """At most ``capacity`` entries; :meth:`get` and :meth:`put` make an entry the most
    recent. Not thread-safe (an event loop's cache)."""

    __slots__ = ("_capacity", "_entries")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity!r}")
        self._capacity = capacity
        self._entries: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def capacity(self) -> int:
        return self._capacity

    def get(self, key: K) -> V | None:
        entries = self._entries
        found = entries.get(key)
        if found is not None:
            entries.move_to_end(key)
        return found

    def put(self, key: K, value: V) -> None:
        entries = self._entries
        entries[key] = value
        entries.move_to_end(key)
        if len(entries) > self._capacity:
            entries.popitem(last=False)


__all__ = ["LruCache"]
