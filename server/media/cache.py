"""An LRU of loaded things with in-flight de-duplication: concurrent requests for the same key
share one load; later ones hit the cache."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from epd.common.tasks import retrieve_exception

Value = TypeVar("Value")


class AsyncLruCache(Generic[Value]):
    """At most ``max_items`` values (None: no limit) and ``max_bytes`` (as weighed by
    ``size_of``) of them; ``get_or_load`` loads each missing key once at a time. Values are
    never None. Loads run on one event loop; ``keys`` may be read from any thread.

    Counts: ``num_hits`` and ``num_misses`` lookups answered by the cache or not (a miss is
    counted by ``get`` only), ``num_loads`` loads started, ``num_evictions`` values dropped to
    stay within the limits; a caller that joins a load in flight is neither hit nor miss."""

    def __init__(
        self,
        max_items: int | None = 256,
        *,
        max_bytes: int | None = None,
        size_of: Callable[[Value], int] | None = None,
    ) -> None:
        if (max_items is not None and max_items < 0) or (max_bytes is not None and max_bytes < 0):
            raise ValueError("cache limits must not be negative")
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._size_of = size_of or (lambda value: 0)
        self._values: OrderedDict[str, tuple[Value, int]] = OrderedDict()
        self._loading: dict[str, asyncio.Task[Value]] = {}
        self._lock = threading.Lock()
        self.num_bytes = 0
        self.num_hits = 0
        self.num_misses = 0
        self.num_loads = 0
        self.num_evictions = 0

    def get(self, key: str, *, count_miss: bool = True) -> Value | None:
        """The cached value of ``key`` (a hit), else None (a miss, counted with ``count_miss``)."""
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                self.num_hits += 1
                return self._values[key][0]
        if count_miss:
            self.num_misses += 1
        return None

    async def get_or_load(self, key: str, load: Callable[[], Awaitable[Value]]) -> Value:
        """The cached value of ``key``, or the result of ``load()``, shared by concurrent callers.

        The load runs in its own task: a caller that is cancelled stops waiting but neither stops
        the load nor fails the others. A failed load is not cached and fails every caller
        waiting on it."""
        if (value := self.get(key, count_miss=False)) is not None:
            return value
        task = self._loading.get(key)
        if task is None:
            self.num_loads += 1
            task = asyncio.ensure_future(self._load_and_keep(key, load))
            task.add_done_callback(retrieve_exception)
            self._loading[key] = task
        return await asyncio.shield(task)

    async def join(self, key: str) -> Value | None:
        """The value of the load of ``key`` in flight, shared as by ``get_or_load``; None when
        there is none (whether or not ``key`` is cached)."""
        task = self._loading.get(key)
        return None if task is None else await asyncio.shield(task)

    async def _load_and_keep(self, key: str, load: Callable[[], Awaitable[Value]]) -> Value:
        try:
            value = await load()
        finally:
            self._loading.pop(key, None)
        self.put(key, value)
        return value

    def get_or_compute(self, key: str, compute: Callable[[], Value]) -> Value:
        """The cached value of ``key``, or ``compute()`` kept: ``get_or_load`` for values made
        without awaiting (no task, no turn of the event loop, so nothing to share in flight)."""
        if (value := self.get(key, count_miss=False)) is not None:
            return value
        self.num_loads += 1
        value = compute()
        self.put(key, value)
        return value

    def put(self, key: str, value: Value) -> None:
        """Keep ``value`` as the most recently used, evicting the least recently used past the
        limits; one too large for them is not kept."""
        size = self._size_of(value)
        if self.max_items == 0 or (self.max_bytes is not None and size > self.max_bytes):
            return
        with self._lock:
            if key in self._values:
                self.num_bytes -= self._values.pop(key)[1]
            self._values[key] = (value, size)
            self.num_bytes += size
            while (self.max_items is not None and len(self._values) > self.max_items) or (
                self.max_bytes is not None and self.num_bytes > self.max_bytes
            ):
                _, (_, evicted) = self._values.popitem(last=False)
                self.num_bytes -= evicted
                self.num_evictions += 1

    def keys(self, limit: int = 1024) -> list[str]:
        """Up to ``limit`` keys cached, most recently used first (from any thread)."""
        with self._lock:
            return list(itertools.islice(reversed(self._values), limit))

    def __len__(self) -> int:
        return len(self._values)
