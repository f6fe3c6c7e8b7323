"""The encoder's held-item journal: a snapshot first and whenever one is due (after a lost
report, every tenth report), else what the cache took and evicted since the previous report, and
what the store stored; nothing on the cache's own path."""

from __future__ import annotations

import torch

from epd.common.held_items import HeldReport
from epd.server.encode.cache import CachedEmbedding, EmbeddingCache
from epd.server.encode.held import HeldItemsJournal


def entry(num_bytes: int) -> CachedEmbedding:
    return CachedEmbedding(torch.zeros(num_bytes // 4), (1, 1, 1))


def test_the_first_report_is_a_snapshot_then_deltas() -> None:
    cache = EmbeddingCache(100)
    cache.put("a", entry(40))
    journal = cache.journal
    assert journal.take() == HeldReport(is_snapshot=True, added=("a",))
    assert journal.take() is None
    cache.put("b", entry(40))
    cache.put("c", entry(40))  # evicts a
    journal.stored("c")
    assert journal.take() == HeldReport(added=("c", "b"), evicted=("a",), stored=("c",))


def test_an_item_taken_then_evicted_between_two_reports_is_no_change() -> None:
    cache = EmbeddingCache(50)
    cache.put("a", entry(40))
    cache.journal.take()
    cache.put("b", entry(40))  # evicts a
    cache.put("a", entry(40))  # evicts b
    assert cache.journal.take() is None
    cache.put("b", entry(40))
    assert cache.journal.take() == HeldReport(added=("b",), evicted=("a",))


def test_a_resync_makes_the_next_report_a_snapshot() -> None:
    held = ["x", "y"]
    journal = HeldItemsJournal(lambda limit: held[:limit], max_items=1)
    assert journal.take() == HeldReport(is_snapshot=True, added=("x",))
    held.insert(0, "z")
    journal.resync()
    assert journal.take() == HeldReport(is_snapshot=True, added=("z",))


def test_every_tenth_report_is_a_snapshot() -> None:
    journal = HeldItemsJournal(lambda limit: ["x"])
    reports = [journal.take() for _ in range(20)]
    snapshots = [i for i, report in enumerate(reports) if report is not None]
    assert snapshots == [0, 9, 19]
