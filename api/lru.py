"""A bounded map that forgets its least recently used entries (every in-memory cache of the service
is one: memory stays bounded however many jobs, plans and workers pass through)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    def __init__(self, capacity: int, evictable: Callable[[V], bool] | None = None):
        """`evictable(value)` False keeps an entry past the bound (e.g. a job with live workers); the
        map then holds at most `capacity` plus the entries that may not go."""
        self.capacity, self.evictable = capacity, evictable
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        if len(self._items) > self.capacity:
            self._evict()

    def _evict(self) -> None:
        excess = len(self._items) - self.capacity
        for key in list(self._items):
            if excess <= 0:
                break
            if self.evictable is None or self.evictable(self._items[key]):
                del self._items[key]
                excess -= 1

    def pop(self, key: K, default: V | None = None) -> V | None:
        return self._items.pop(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[K]:
        return iter(list(self._items))

    def values(self) -> Iterator[V]:
        return iter(list(self._items.values()))
