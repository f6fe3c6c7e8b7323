"""Striped READs without NIXL: how regions are cut, which CPUs each reader keeps to, and how the
readers run jobs (every job waited for, errors raised after, binding one reader at a time)."""

from __future__ import annotations

import threading
import time

import pytest

from epd.server.transfer.nixl_agent import _int_env
from epd.server.transfer.nixl_stripes import PAGE_BYTES, StripeReaders, cpu_share, split_regions

MiB = 1 << 20


def joined(parts: list[tuple[tuple, tuple]], side: int) -> list[tuple[int, int, int]]:
    """The regions of one side of every part, end to end, with touching regions merged."""
    merged: list[list[int]] = []
    for part in parts:
        for address, length, device in part[side]:
            if merged and merged[-1][0] + merged[-1][1] == address and merged[-1][2] == device:
                merged[-1][1] += length
            else:
                merged.append([address, length, device])
    return [(address, length, device) for address, length, device in merged]


def test_one_region_is_cut_in_two_halves_on_a_page_boundary() -> None:
    local, remote = ((0x10000, 16 * MiB, 0),), ((0x900000, 16 * MiB, 0),)
    parts = split_regions(local, remote, 2)
    assert parts == [(((0x10000, 8 * MiB, 0),), ((0x900000, 8 * MiB, 0),)),
                     (((0x10000 + 8 * MiB, 8 * MiB, 0),), ((0x900000 + 8 * MiB, 8 * MiB, 0),))]


def test_stamp_and_payload_are_cut_across_their_boundary_and_stay_matched() -> None:
    local = ((1 << 30, 64, 0), ((1 << 30) + 64, 3 * MiB + 12800, 0))
    remote = ((5 << 30, 64, 0), (7 << 30, 3 * MiB + 12800, 0))
    parts = split_regions(local, remote, 2)
    assert len(parts) == 2
    for local_part, remote_part in parts:
        assert [n for _, n, _ in local_part] == [n for _, n, _ in remote_part]
    first_bytes = sum(n for _, n, _ in parts[0][1])
    assert first_bytes % PAGE_BYTES == 0
    assert abs(first_bytes - sum(n for _, n, _ in parts[1][1])) <= 2 * PAGE_BYTES
    assert joined(parts, 0) == [((1 << 30), 64 + 3 * MiB + 12800, 0)]
    assert joined(parts, 1) == [(5 << 30, 64, 0), (7 << 30, 3 * MiB + 12800, 0)]


def test_small_reads_stay_whole_and_more_readers_than_pages_leave_some_idle() -> None:
    assert split_regions(((0, 100, 0),), ((4096, 100, 0),), 2) == [(((0, 100, 0),),
                                                                    ((4096, 100, 0),))]
    parts = split_regions(((0, 3 * PAGE_BYTES, 0),), ((1 << 20, 3 * PAGE_BYTES, 0),), 8)
    assert [sum(n for _, n, _ in remote) for _, remote in parts] == [PAGE_BYTES] * 3


def test_regions_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="local region of 10 bytes"):
        split_regions(((0, 10, 0),), ((0, 12, 0),), 2)


def test_each_reader_keeps_to_its_own_share_of_the_cpus() -> None:
    assert [cpu_share([0, 1], index, 2) for index in range(2)] == [{0}, {1}]
    assert cpu_share(list(range(8)), 1, 2) == {1, 3, 5, 7}
    assert cpu_share([3], 1, 2) == {3}


def test_readers_bind_one_after_another_and_run_each_job_on_its_own_thread() -> None:
    bound: list[str] = []
    inside = threading.Semaphore(1)

    def bind() -> None:
        assert inside.acquire(blocking=False), "two readers were binding at once"
        time.sleep(0.01)
        bound.append(threading.current_thread().name)
        inside.release()

    readers = StripeReaders(2, bind)
    try:
        assert bound == ["epd-nixl-reader-0", "epd-nixl-reader-1"]
        ran: list[str] = []
        readers.run_all([lambda: ran.append(threading.current_thread().name)] * 4)
        assert sorted(ran) == ["epd-nixl-reader-0"] * 2 + ["epd-nixl-reader-1"] * 2
    finally:
        readers.stop()
        readers.stop()


def test_a_failed_job_is_raised_only_once_every_job_is_done() -> None:
    readers = StripeReaders(2, lambda: None)
    finished = threading.Event()

    def fail() -> None:
        raise OSError("stripe failed")

    def slow() -> None:
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
    with pytest.raises(ValueError, match="at least 2 readers"):
        StripeReaders(1, lambda: None)


def test_settings_from_the_environment_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EPD_TEST_STRIPES", raising=False)
    assert _int_env("EPD_TEST_STRIPES", 2, minimum=1) == 2
    monkeypatch.setenv("EPD_TEST_STRIPES", "4")
    assert _int_env("EPD_TEST_STRIPES", 2, minimum=1) == 4
    monkeypatch.setenv("EPD_TEST_STRIPES", "two")
    with pytest.raises(ValueError, match=r"\$EPD_TEST_STRIPES must be an integer, got 'two'"):
        _int_env("EPD_TEST_STRIPES", 2, minimum=1)
    monkeypatch.setenv("EPD_TEST_STRIPES", "0")
    with pytest.raises(ValueError, match="at least 1"):
        _int_env("EPD_TEST_STRIPES", 2, minimum=1)
