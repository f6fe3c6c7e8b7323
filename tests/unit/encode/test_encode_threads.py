"""The encoder's pool threads: named for the OS, each with its own number of torch threads."""

from __future__ import annotations

from pathlib import Path

import torch

from epd.server.encode.app import EncodeConfig, threads_of


def os_name_and_torch_threads() -> tuple[str, int]:
    """The calling thread's OS name and torch threads, after a parallel torch call (torch sets a
    thread's threads up at its first one)."""
    matrix = torch.ones(64, 64)
    (matrix @ matrix).sum()
    return Path("/proc/thread-self/comm").read_text().strip(), torch.get_num_threads()


def test_each_pool_thread_keeps_its_name_and_torch_threads_whichever_starts_first() -> None:
    """``top -H``, ``ps -L``, py-spy and bench_encode's CPU by thread tell the threads apart; a
    preparing thread computes with one torch thread and the tower with the process's, even when
    the tower's thread starts between a preparing thread's start and its first torch call (torch
    then set the preparing thread up with the tower's number: the last one set)."""
    expected_tower = ("epd-tower", torch.get_num_threads())
    pool, tower = threads_of(EncodeConfig(Path("unused"), preprocess_threads=2))
    try:
        pool.submit(lambda: None).result()
        tower.submit(lambda: None).result()
        assert pool.submit(os_name_and_torch_threads).result() == ("epd-prepare", 1)
        assert tower.submit(os_name_and_torch_threads).result() == expected_tower
    finally:
        pool.shutdown()
        tower.shutdown()
