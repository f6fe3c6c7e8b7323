"""The idle pool behind every data-plane pool: reuse by capacity, the byte budget, and close."""

from __future__ import annotations

from epd.server.transfer.idle_pool import IdlePool


def test_items_come_back_by_capacity_last_put_first() -> None:
    pool: IdlePool[str] = IdlePool(max_idle_bytes=100)
    assert pool.take(10) is None
    assert pool.offer(10, "a") and pool.offer(10, "b") and pool.offer(20, "c")
    assert pool.idle_bytes == 40
    assert pool.take(10) == "b" and pool.take(10) == "a" and pool.take(10) is None
    assert pool.take(20) == "c" and pool.idle_bytes == 0


def test_offers_over_the_budget_are_refused() -> None:
    pool: IdlePool[str] = IdlePool(max_idle_bytes=25)
    assert pool.offer(20, "a")
    assert not pool.offer(10, "b"), "the owner frees what the pool refuses"
    assert pool.offer(5, "c") and pool.idle_bytes == 25


def test_close_hands_back_the_idle_items_and_refuses_later_offers() -> None:
    pool: IdlePool[str] = IdlePool(max_idle_bytes=100)
    pool.offer(10, "a")
    pool.offer(20, "b")
    assert sorted(pool.close()) == ["a", "b"] and pool.idle_bytes == 0
    assert not pool.offer(10, "c") and pool.take(10) is None
