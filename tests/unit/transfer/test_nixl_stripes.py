"""Striped READs without NIXL: how regions are cut, which CPUs each reader keeps to, and how the
readers run jobs (every job waited for, errors raised after, binding one reader at a time)."""

from __future__ import annotations

import functools
import threading
import time

import pytest

from epd.server.common.env import int_env
from epd.server.transfer.nixl_prepared import Region, Regions
from epd.server.transfer.nixl_stripes import (
    ANCHOR_BYTES,
    PAGE_BYTES,
    StripeReaders,
    cpu_share,
    split_regions,
)

MiB = 1 << 20


def without_anchors(parts: list[tuple[Regions, Regions]], side: int) -> list[Region]:
    """The regions of one side of every part, anchors dropped, touching regions merged."""
    merged: list[list[int]] = []
    for part in parts:
        for index, (address, length, device) in enumerate(part[side]):
            if index == 0 and len(part[side]) > 1 and length == ANCHOR_BYTES:
                continue
            if merged and merged[-1][0] + merged[-1][1] == address and merged[-1][2] == device:
                merged[-1][1] += length
            else:
                merged.append([address, length, device])
    return [(address, length, device) for address, length, device in merged]


def test_one_region_is_cut_in_two_halves_on_a_page_boundary() -> None:
    local, remote = ((0x10000, 16 * MiB, 0),), ((0x900000, 16 * MiB, 0),)
    parts = split_regions(local, remote, 2)
    assert parts == [(((0x10000, 8 * MiB, 0),), ((0x900000, 8 * MiB, 0),)),
                     (((0x10000, 8, 0), (0x10000 + 8 * MiB, 8 * MiB, 0)),
                      ((0x900000, 8, 0), (0x900000 + 8 * MiB, 8 * MiB, 0)))]


def test_a_part_that_starts_inside_a_region_rereads_the_start_of_that_region() -> None:
    local = ((1 << 30, 64, 0), ((1 << 30) + 64, 3 * MiB + 12800, 0))
    remote = ((5 << 30, 64, 0), (7 << 30, 3 * MiB + 12800, 0))
    parts = split_regions(local, remote, 2)
    assert len(parts) == 2
    for local_part, remote_part in parts:
        assert [n for _, n, _ in local_part] == [n for _, n, _ in remote_part]
    assert parts[1][0][0] == ((1 << 30) + 64, ANCHOR_BYTES, 0)  # the payload's first bytes again
    assert parts[1][1][0] == (7 << 30, ANCHOR_BYTES, 0)
    first_bytes = sum(n for _, n, _ in parts[0][1])
    assert first_bytes % PAGE_BYTES == 0
    second_bytes = sum(n for _, n, _ in parts[1][1]) - ANCHOR_BYTES
    assert first_bytes + second_bytes == 64 + 3 * MiB + 12800
    assert abs(first_bytes - second_bytes) <= 2 * PAGE_BYTES
    assert without_anchors(parts, 0) == [((1 << 30), 64 + 3 * MiB + 12800, 0)]
    assert without_anchors(parts, 1) == [(5 << 30, 64, 0), (7 << 30, 3 * MiB + 12800, 0)]


def test_small_reads_stay_whole_and_more_readers_than_pages_leave_some_idle() -> None:
    assert split_regions(((0, 100, 0),), ((4096, 100, 0),), 2) == [(((0, 100, 0),),
                                                                    ((4096, 100, 0),))]
    parts = split_regions(((0, 3 * PAGE_BYTES, 0),), ((1 << 20, 3 * PAGE_BYTES, 0),), 8)
    assert [sum(n for _, n, _ in remote) for _, remote in parts] == [
        PAGE_BYTES, PAGE_BYTES + ANCHOR_BYTES, PAGE_BYTES + ANCHOR_BYTES]


def test_regions_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="local region of 10 bytes"):
        split_regions(((0, 10, 0),), ((0, 12, 0),), 2)


def test_each_reader_keeps_to_its_own_share_of_the_cpus() -> None:
    assert [cpu_share([0, 1], index, 2) for index in range(2)] == [{0}, {1}]
    assert cpu_share(list(range(8)), 1, 2) == {1, 3, 5, 7}
    assert cpu_share([3], 1, 2) == {3}


def test_readers_bind_one_after_another() -> None:
    bound: list[str] = []
    inside = threading.Semaphore(1)

    def bind() -> None:
        assert inside.acquire(blocking=False), "two readers were binding at once"
        time.sleep(0.01)
        bound.append(threading.current_thread().name)
        inside.release()

    readers = StripeReaders(2, bind)
    readers.stop()
    readers.stop()
    assert bound == ["epd-nixl-reader-0", "epd-nixl-reader-1"]


def test_readers_read_parts_at_the_same_time_and_the_caller_waits() -> None:
    readers = StripeReaders(2, lambda: None)
    both_started = threading.Barrier(2, timeout=5)
    ran: list[tuple[int, str]] = []

    def part(index: int) -> None:
        ran.append((index, threading.current_thread().name))
        both_started.wait()  # NOTE: raises BrokenBarrierError unless two parts run at once

    try:
        readers.run_all([functools.partial(part, index) for index in range(2)])
    finally:
        readers.stop()
    assert sorted(index for index, _ in ran) == [0, 1]
    assert {name for _, name in ran} == {"epd-nixl-reader-0", "epd-nixl-reader-1"}


def test_a_busy_reader_leaves_its_parts_to_the_others() -> None:
    readers = StripeReaders(2, lambda: None)
    release = threading.Event()
    blocked = threading.Thread(target=readers.run_all, args=([release.wait],))
    blocked.start()
    try:
        done: list[int] = []
        caller = threading.Thread(target=readers.run_all,
                                  args=([functools.partial(done.append, index)
                                         for index in range(4)],))  # fmt: skip
        caller.start()
        caller.join(5)
        assert done == [0, 1, 2, 3], "the parts waited for a busy reader"
    finally:
        release.set()
        blocked.join()
        readers.stop()


def test_a_failed_job_is_raised_only_once_every_job_is_done() -> None:
    readers = StripeReaders(2, lambda: None)
    started, finished = threading.Event(), threading.Event()

    def fail() -> None:
        assert started.wait(5), "no reader took the slow part"
        raise OSError("stripe failed")

    def slow() -> None:
        started.set()
        time.sleep(0.05)
        finished.set()

    try:
        with pytest.raises(OSError, match="stripe failed"):
            readers.run_all([fail, slow])
        assert finished.is_set()
        readers.run_all([lambda: None, lambda: None])
    finally:
        readers.stop()


def test_a_reader_that_cannot_bind_fails_the_constructor() -> None:
    def bind() -> None:
        raise RuntimeError("no loopback")

    with pytest.raises(RuntimeError, match="no loopback"):
        StripeReaders(2, bind)
    with pytest.raises(ValueError, match="at least 1 reader"):
        StripeReaders(0, lambda: None)


def test_settings_from_the_environment_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EPD_TEST_STRIPES", raising=False)
    assert int_env("EPD_TEST_STRIPES", 2, minimum=1) == 2
    monkeypatch.setenv("EPD_TEST_STRIPES", "4")
    assert int_env("EPD_TEST_STRIPES", 2, minimum=1) == 4
    monkeypatch.setenv("EPD_TEST_STRIPES", "two")
    with pytest.raises(ValueError, match=r"\$EPD_TEST_STRIPES must be an integer, got 'two'"):
        int_env("EPD_TEST_STRIPES", 2, minimum=1)
    monkeypatch.setenv("EPD_TEST_STRIPES", "0")
    with pytest.raises(ValueError, match="at least 1"):
        int_env("EPD_TEST_STRIPES", 2, minimum=1)
