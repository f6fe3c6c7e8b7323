"""Striped NIXL READs: one large READ cut into parts that reader threads post at the same time,
each on a UCX worker of its own.

On one host UCX READs through CMA (``process_vm_readv``): one kernel copy per posting thread.
On the 2-core development machine one thread copied 16 MiB at ~9 GB/s, well under a plain memcpy
(~20 GB/s), and two threads reading a half each took about half as long (scripts/bench_transfer.py
prints both). Across hosts the same cut spreads a READ over several UCX workers.

NIXL binds a thread to one of its UCX backend's shared workers on the thread's first transfer
request, round robin from worker 1; two threads bound to one worker take turns on its lock. So the
readers are started and bound one after another when the agent is created, before any other thread
uses it: reader i makes its first request (``bind``) and lands on worker i + 1 of ``count`` + 1;
the threads that come later start again at worker 0. The calling thread waits: it could take a
part itself, but its worker is whichever its turn gave it, and sharing a reader's worker it made
that reader wait (128 MiB took 0.52-0.61x a memcpy in three parts so, 0.70-0.85x in two parts
read by the readers alone).

Each reader runs on its own share of the CPUs this process may use (reader i on every
``count``-th one from the i-th). Left free, the scheduler woke both readers on the CPU of the
thread that handed them their parts, and the second one waited there until the first had finished
its copy (~1 ms for 8 MiB): the READ took as long as an unstriped one. Readers claim parts
rather than being handed one each, so a reader that wakes late (on an idle CPU of a virtual
machine that took up to a millisecond) leaves its part to the other.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future

from epd.server.transfer.nixl_prepared import Region, Regions

Job = Callable[[], None]
PAGE_BYTES = 4096
ANCHOR_BYTES = 8


def split_regions(local: Regions, remote: Regions, count: int) -> list[tuple[Regions, Regions]]:
    """Cut matching ``local`` and ``remote`` regions (equal lengths pair by pair) into at most
    ``count`` parts of nearly equal bytes, cut at page multiples; the pairs stay matched.

    A part that starts inside a region begins with an anchor: the first ``ANCHOR_BYTES`` of that
    region again, to the same local bytes as the part that holds the region's start (identical
    bytes, so the two writes cannot disagree). NOTE: NIXL finds the registration of a READ's
    first remote region by binary search on its start address, and keeps the records of regions
    the producer has since deregistered; a cut inside a lent tensor could land behind such a
    stale record and be refused, while its registration's own start always finds it."""
    total = sum(length for _, length, _ in remote)
    per_part = -(-total // max(1, count))
    per_part = max(PAGE_BYTES, -(-per_part // PAGE_BYTES) * PAGE_BYTES)
    parts: list[tuple[Regions, Regions]] = []
    local_part: list[Region] = []
    remote_part: list[Region] = []
    room = per_part
    for (local_address, length, local_device), (remote_address, remote_length,
                                                remote_device) in zip(local, remote, strict=True):
        if length != remote_length:
            raise ValueError(f"local region of {length} bytes against a remote one of "
                             f"{remote_length}")  # fmt: skip
        anchor = min(ANCHOR_BYTES, length)
        offset = 0
        while offset < length:
            if offset and not local_part:
                local_part.append((local_address, anchor, local_device))
                remote_part.append((remote_address, anchor, remote_device))
            take = min(length - offset, room)
            local_part.append((local_address + offset, take, local_device))
            remote_part.append((remote_address + offset, take, remote_device))
            offset += take
            room -= take
            if not room:
                parts.append((tuple(local_part), tuple(remote_part)))
                local_part, remote_part, room = [], [], per_part
    if local_part:
        parts.append((tuple(local_part), tuple(remote_part)))
    return parts


class Batch:
    """Jobs that any thread may claim, each run exactly once, in order of claiming."""

    def __init__(self, jobs: list[Job]) -> None:
        self._jobs = jobs
        self._next = 0
        self._num_left = len(jobs)
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self.done = threading.Event()
        if not jobs:
            self.done.set()

    def work(self) -> None:
        """Claim and run jobs until none is left unclaimed."""
        while (job := self._claim()) is not None:
            try:
                job()
            except BaseException as e:
                self._finish(e)
            else:
                self._finish(None)

    def _claim(self) -> Job | None:
        with self._lock:
            if self._next == len(self._jobs):
                return None
            self._next += 1
            return self._jobs[self._next - 1]

    def _finish(self, error: BaseException | None) -> None:
        with self._lock:
            if error is not None:
                self.errors.append(error)
            self._num_left -= 1
            if not self._num_left:
                self.done.set()


class StripeReaders:
    """``count`` daemon threads that run batches of READ jobs for callers; each reader calls
    ``bind`` once, in turn, first."""

    def __init__(self, count: int, bind: Callable[[], None]) -> None:
        if count < 1:
            raise ValueError(f"striped READs need at least 1 reader, got {count}")
        self.count = count
        self._queues: list[queue.SimpleQueue[Batch | None]] = []
        self._threads: list[threading.Thread] = []
        for index in range(count):
            bound: Future[None] = Future()
            batches: queue.SimpleQueue[Batch | None] = queue.SimpleQueue()
            thread = threading.Thread(target=self._serve, args=(index, bind, bound, batches),
                                      daemon=True, name=f"epd-nixl-reader-{index}")  # fmt: skip
            self._queues.append(batches)
            thread.start()
            self._threads.append(thread)
            bound.result()  # NOTE: one at a time, so that each lands on the next worker

    def _serve(self, index: int, bind: Callable[[], None], bound: Future[None],
               batches: queue.SimpleQueue[Batch | None]) -> None:  # fmt: skip
        try:
            _keep_to_cpu_share(index, self.count)
            bind()
        except BaseException as e:
            bound.set_exception(e)
            return
        bound.set_result(None)
        while (batch := batches.get()) is not None:
            batch.work()

    def run_all(self, jobs: list[Job]) -> None:
        """Run ``jobs`` on the readers (each claims the next job left until none is) and return
        once every job has finished (a job still writing into the caller's memory must never
        outlive the call), then raise the first failure."""
        batch = Batch(jobs)
        for batches in self._queues:
            batches.put(batch)
        batch.done.wait()
        if batch.errors:
            raise batch.errors[0]

    def stop(self) -> None:
        """Let the readers finish the jobs queued and exit (idempotent)."""
        for batches in self._queues:
            batches.put(None)
        for thread in self._threads:
            thread.join()
        self._threads.clear()


def cpu_share(cpus: list[int], index: int, count: int) -> set[int]:
    """Reader ``index``'s share of ``cpus``: every ``count``-th one from the ``index``-th (all of
    them when there are fewer CPUs than readers)."""
    share = set(cpus[index::count])
    return share or set(cpus)


def _keep_to_cpu_share(index: int, count: int) -> None:
    """Keep the calling thread on its share of this process's CPUs (where the platform can)."""
    if not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, cpu_share(cpus, index, count))
