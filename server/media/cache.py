"""An LRU of loaded things with in-flight de-duplication: concurrent requests for the same key
share one load; later ones hit the cache."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from epd.common.tasks import retrieve_exception

Value = TypeVar("Value")


class AsyncLruCache(Generic[Value]):
    """At most ``max_items`` values and ``max_bytes`` (as weighed by ``size_of``) of them;
    ``get_or_load`` loads each missing key once at a time. Not thread-safe: one event loop."""

    def __init__(
        self,
        max_items: int = 256,
        *,
        max_bytes: int | None = None,
        size_of: Callable[[Value], int] | None = None,
    ) -> None:
        if max_items < 0 or (max_bytes is not None and max_bytes < 0):
            raise ValueError("cache limits must not be negative")
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._size_of = size_of or (lambda value: 0)
        self._values: OrderedDict[str, tuple[Value, int]] = OrderedDict()
        self._loading: dict[str, asyncio.Task[Value]] = {}
        self.num_bytes = 0
        self.num_hits = 0
        self.num_loads = 0

    async def get_or_load(self, key: str, load: Callable[[], Awaitable[Value]]) -> Value:
        """The cached value of ``key``, or the result of ``load()``, shared by concurrent callers.

        The load runs in its own task: a caller that is cancelled stops waiting but neither stops
        the load nor fails the others. A failed load is not cached and fails every caller
        waiting on it."""
        if key in self._values:
            self._values.move_to_end(key)
            self.num_hits += 1
            return self._values[key][0]
        task = self._loading.get(key)
        if task is None:
            self.num_loads += 1
            task = asyncio.ensure_future(self._load_and_keep(key, load))
            task.add_done_callback(retrieve_exception)
            self._loading[key] = task
        else:
            self.num_hits += 1
        return await asyncio.shield(task)

    async def _load_and_keep(self, key: str, load: Callable[[], Awaitable[Value]]) -> Value:
        try:
            value = await load()
        finally:
            self._loading.pop(key, None)
        self._put(key, value)
        return value

    def get_or_compute(self, key: str, compute: Callable[[], Value]) -> Value:
        """The cached value of ``key``, or ``compute()`` kept: ``get_or_load`` for values made
        without awaiting (no task, no turn of the event loop, so nothing to share in flight)."""
        if key in self._values:
            self._values.move_to_end(key)
            self.num_hits += 1
            return self._values[key][0]
        self.num_loads += 1
        value = compute()
        self._put(key, value)
        return value

    def _put(self, key: str, value: Value) -> None:
        size = self._size_of(value)
        if self.max_items == 0 or (self.max_bytes is not None and size > self.max_bytes):
            return
        if key in self._values:
            self.num_bytes -= self._values.pop(key)[1]
        self._values[key] = (value, size)
        self.num_bytes += size
        while len(self._values) > self.max_items or (
            self.max_bytes is not None and self.num_bytes > self.max_bytes
        ):
            _, (_, evicted) = self._values.popitem(last=False)
            self.num_bytes -= evicted

    def __len__(self) -> int:
        return len(self._values)
