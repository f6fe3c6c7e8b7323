"""The async LRU the media loaders and the encoder share: one load per key in flight, joined by
the others (cancelling one caller fails none), failures shared and not cached, its counts, and
its keys read from another thread while the loop fills it."""

from __future__ import annotations

import asyncio
import threading

import pytest

from epd.server.media.cache import AsyncLruCache


async def test_concurrent_callers_share_one_load_and_a_joiner_is_no_hit() -> None:
    cache: AsyncLruCache[str] = AsyncLruCache(None, max_bytes=5, size_of=len)
    gate, calls = asyncio.Event(), []

    async def load() -> str:
        calls.append(1)
        await gate.wait()
        return "abc"

    first = asyncio.ensure_future(cache.get_or_load("k", load))
    second = asyncio.ensure_future(cache.get_or_load("k", load))
    await asyncio.sleep(0)
    joined = asyncio.ensure_future(cache.join("k"))
    assert await cache.join("other") is None
    await asyncio.sleep(0)
    first.cancel()
    gate.set()
    assert (await second, await joined) == ("abc", "abc") and first.cancelled()
    assert (calls, cache.num_loads, cache.num_hits, cache.num_misses) == ([1], 1, 0, 0)
    assert await cache.join("k") is None and cache.get("k") == "abc" and cache.num_hits == 1


async def test_a_failed_load_fails_its_joiners_and_is_not_cached() -> None:
    cache: AsyncLruCache[str] = AsyncLruCache()

    async def fail() -> str:
        await asyncio.sleep(0.01)
        raise KeyError("unreadable")

    loading = asyncio.ensure_future(cache.get_or_load("k", fail))
    await asyncio.sleep(0)
    outcomes = await asyncio.gather(loading, cache.join("k"), return_exceptions=True)
    assert all(isinstance(outcome, KeyError) for outcome in outcomes)
    assert cache.get("k") is None and cache.num_misses == 1 and len(cache) == 0


def test_the_least_recently_used_go_past_the_byte_budget_and_are_counted() -> None:
    cache: AsyncLruCache[str] = AsyncLruCache(None, max_bytes=6, size_of=len)
    for key in "abc":
        cache.put(key, key * 2)
    assert cache.get("a") == "aa"
    cache.put("d", "dd")
    cache.put("huge", "x" * 7)
    assert cache.get("b") is None and cache.get("huge") is None
    assert (cache.keys(), cache.keys(2)) == (["d", "a", "c"], ["d", "a"])
    assert (cache.num_bytes, cache.num_evictions, cache.num_misses) == (6, 1, 2)
    with pytest.raises(ValueError):
        AsyncLruCache(None, max_bytes=-1)


def test_keys_can_be_read_from_another_thread_while_the_cache_changes() -> None:
    cache: AsyncLruCache[str] = AsyncLruCache(64)
    stop, failures = threading.Event(), []

    def read() -> None:
        while not stop.is_set():
            try:
                assert len(cache.keys()) <= 64
            except Exception as error:  # NOTE: e.g. the OrderedDict mutated during iteration
                failures.append(error)
                return

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(200_000):
        cache.put(str(i % 1000), "v")
    stop.set()
    reader.join()
    assert failures == [] and len(cache) == 64
