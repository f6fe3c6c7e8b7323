"""The encoder's pool threads: named for the OS, each with its torch threads."""

from __future__ import annotations

from pathlib import Path

import torch

from epd.server.encode.app import EncodeConfig, threads_of


def os_name_and_torch_threads() -> tuple[str, int]:
    return Path("/proc/thread-self/comm").read_text().strip(), torch.get_num_threads()


def test_the_preparing_pool_and_the_tower_s_thread_carry_their_names_for_the_os() -> None:
    """``top -H``, ``ps -L``, py-spy and bench_encode's CPU by thread tell them apart; a
    preparing thread computes with one torch thread, the tower with the process's."""
    pool, tower = threads_of(EncodeConfig(Path("unused"), preprocess_threads=2))
    try:
        assert pool.submit(os_name_and_torch_threads).result() == ("epd-prepare", 1)
        expected = ("epd-tower", torch.get_num_threads())
        assert tower.submit(os_name_and_torch_threads).result() == expected
    finally:
        pool.shutdown()
        tower.shutdown()
