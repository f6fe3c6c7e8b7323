"""The encoder's held-item journal: a snapshot first and whenever one is due (after a lost
report, past the bound), then what the cache took and evicted and what the store stored, netted
per item."""

from __future__ import annotations

import torch

from epd.scheduler.model import HeldReport
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
    assert journal.take() == HeldReport(added=("b", "c"), evicted=("a",), stored=("c",))


def test_an_item_taken_then_evicted_is_reported_evicted() -> None:
    cache = EmbeddingCache(50)
    cache.journal.take()
    cache.put("a", entry(40))
    cache.put("b", entry(40))
    cache.put("a", entry(40))
    assert cache.journal.take() == HeldReport(added=("a",), evicted=("b",))


def test_a_resync_or_too_many_changes_make_the_next_report_a_snapshot() -> None:
    held = ["x", "y"]
    journal = HeldItemsJournal(lambda limit: held[:limit], max_changes=2)
    journal.take()
    journal.record("z", True)
    journal.resync()
    assert journal.take() == HeldReport(is_snapshot=True, added=("x", "y"))
    for mm_hash in ("p", "q", "r"):
        journal.record(mm_hash, True)
    assert journal.take() == HeldReport(is_snapshot=True, added=("x", "y"))
    assert journal.num_snapshots == 3


def test_every_tenth_report_is_a_snapshot() -> None:
    journal = HeldItemsJournal(lambda limit: ["x"])
    reports = [journal.take() for _ in range(20)]
    snapshots = [i for i, report in enumerate(reports) if report is not None]
    assert snapshots == [0, 9, 19]
