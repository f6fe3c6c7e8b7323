"""Dynamic batching: images from concurrent requests share one vision-tower call.

Requests enqueue images; a single worker task takes up to ``max_items`` waiting at most
``max_wait_s`` after the first one (0: only what is already queued), runs the tower and resolves
each image's future. The tower runs in a worker thread so the event loop keeps serving, except a
batch expected to finish within ``inline_below_s``: that one runs on the event loop itself,
because the hand-off to a thread and back costs more than such a short blocking call. The
expectation is the tower's own time per item in the latest batch, the hand-off excluded: it is
what an inline batch would block the loop for. When a batch of several fails, its items run
again one by one, so one bad image fails only its own request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")
# Called after each batch that succeeded with its number of items and its duration in seconds.
BatchObserver = Callable[[int, float], None]
# The size of one item (an image's vision tokens), for the queue's counters.
Weigh = Callable[[Item], int]


@dataclass(slots=True)
class BatchStats:
    """Counters and recent latency, for heartbeats, metrics and tests."""

    num_batches: int = 0
    num_items: int = 0
    num_failed_batches: int = 0
    item_latency_ms: float = 0.0  # the latest batch's, from its start to its results, per item
    item_run_ms: float = 0.0  # the latest batch's ``run`` alone (no thread hand-off), per item
    batch_weight: int = 0  # the latest batch's items' summed ``weigh`` (its vision tokens)


@dataclass(frozen=True, slots=True)
class _Queued(Generic[Item, Result]):
    """An item waiting for a batch: what ``weigh`` said of it, the future of its result and of
    its batch's size."""

    item: Item
    weight: int
    future: asyncio.Future[tuple[Result, int]]


class DynamicBatcher(Generic[Item, Result]):
    """Batches calls of ``run(items) -> results`` (same order, same length)."""

    def __init__(
        self,
        run: Callable[[list[Item]], list[Result]],
        *,
        max_items: int,
        max_wait_s: float = 0.0,
        inline_below_s: float = 0.0,
        on_batch: BatchObserver | None = None,
        executor: Executor | None = None,
    ) -> None:
        """``on_batch`` sees every batch that succeeded (metrics); it runs on the event loop.
        ``executor``: where batches that do not run inline run (None: asyncio's default)."""
        self.executor = executor
        if max_items < 1 or max_wait_s < 0 or inline_below_s < 0:
            raise ValueError("max_items must be >= 1, max_wait_s and inline_below_s >= 0")
        self._run = run
        self.max_items = max_items
        self.max_wait_s = max_wait_s
        self.inline_below_s = inline_below_s
        self._queue: asyncio.Queue[_Queued[Item, Result]] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self.stats = BatchStats()
        self.num_running = 0
        self.on_batch = on_batch
        # NOTE: what ``weigh`` (None: nothing) said of each item when submitted, summed over the
        # items waiting and over the batch running.
        self.weigh: Weigh[Item] | None = None
        self.queued_weight = 0
        self.running_weight = 0

    @property
    def queue_depth(self) -> int:
        """Items waiting for a batch."""
        return self._queue.qsize()

    async def submit(self, item: Item) -> Result:
        """Result of ``item``, computed in some batch."""
        result, _ = await self.submit_sized(item)
        return result

    async def submit_sized(self, item: Item) -> tuple[Result, int]:
        """Result of ``item`` and the number of items in the batch that computed it.
        Cancelling the caller withdraws the item if its batch has not started."""
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._work())
        future: asyncio.Future[tuple[Result, int]] = asyncio.get_running_loop().create_future()
        weight = 0 if self.weigh is None else self.weigh(item)
        self.queued_weight += weight
        await self._queue.put(_Queued(item, weight, future))
        return await future

    async def close(self) -> None:
        """Stop the worker; waiting items fail with CancelledError."""
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
        while not self._queue.empty():
            self._queue.get_nowait().future.cancel()
        self.queued_weight = 0

    async def _work(self) -> None:
        while True:
            batch = [await self._queue.get()]
            deadline = time.monotonic() + self.max_wait_s
            while len(batch) < self.max_items:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    # NOTE: not wait_for(get(), 0), which times out before get() runs at all.
                    if self._queue.empty():
                        break
                    batch.append(self._queue.get_nowait())
                    continue
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), remaining))
                except TimeoutError:
                    break
            self.queued_weight -= sum(queued.weight for queued in batch)
            live = [queued for queued in batch if not queued.future.cancelled()]
            if live:
                await self._run_batch(live)

    async def _run_batch(self, batch: list[_Queued[Item, Result]]) -> None:
        start = time.monotonic()
        self.num_running = len(batch)
        items = [queued.item for queued in batch]
        self.running_weight = sum(queued.weight for queued in batch)
        # NOTE: expected from the latest batch's time per item (none before the first batch).
        expected_s = self.stats.item_run_ms * len(items) / 1000
        try:
            if self.stats.num_batches and expected_s < self.inline_below_s:
                results, run_s = self._timed_run(items)
            else:
                results, run_s = await asyncio.get_running_loop().run_in_executor(
                    self.executor, self._timed_run, items
                )
        except Exception as e:
            if len(batch) == 1:
                if not batch[0].future.done():
                    batch[0].future.set_exception(e)
                return
            self.stats.num_failed_batches += 1
            for single in batch:
                await self._run_batch([single])
            return
        finally:
            self.num_running = 0
            batch_weight, self.running_weight = self.running_weight, 0
        elapsed_ms = (time.monotonic() - start) * 1000
        self.stats.num_batches += 1
        self.stats.num_items += len(batch)
        self.stats.item_latency_ms = elapsed_ms / len(batch)
        self.stats.item_run_ms = run_s * 1000 / len(batch)
        self.stats.batch_weight = batch_weight
        if self.on_batch is not None:
            self.on_batch(len(batch), elapsed_ms / 1000)
        for queued, result in zip(batch, results, strict=True):
            if not queued.future.done():
                queued.future.set_result((result, len(batch)))

    def _timed_run(self, items: list[Item]) -> tuple[list[Result], float]:
        """``run(items)`` and its duration in seconds (measured where it runs)."""
        start = time.monotonic()
        results = self._run(items)
        return results, time.monotonic() - start
