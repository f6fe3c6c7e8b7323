"""KvBudget: first-come-first-served KV reservations, waiting, cancellation, impossible sizes."""

from __future__ import annotations

import asyncio

import pytest

from epd.common.errors import InvalidArgument
from epd.server.engine.kv_budget import KvBudget, check_room, kv_capacity


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_reservations_that_fit_are_granted_at_once() -> None:
    budget = KvBudget(100)
    await budget.acquire(60)
    await budget.acquire(40)
    assert (budget.num_used, budget.num_holding, budget.usage) == (100, 2, 1.0)
    budget.release(60)
    budget.release(40)
    assert (budget.num_used, budget.num_holding, budget.num_waiting) == (0, 0, 0)


async def test_a_request_that_does_not_fit_waits_and_so_do_the_ones_behind_it() -> None:
    budget = KvBudget(100)
    await budget.acquire(80)
    big = asyncio.create_task(budget.acquire(50))
    small = asyncio.create_task(budget.acquire(10))
    await settle()
    assert not big.done() and not small.done() and budget.num_waiting == 2
    budget.release(80)
    await asyncio.wait_for(asyncio.gather(big, small), 1)
    assert (budget.num_used, budget.num_holding, budget.num_waiting) == (60, 2, 0)


async def test_cancelling_a_waiter_holds_nothing_and_unblocks_the_next() -> None:
    budget = KvBudget(100)
    await budget.acquire(60)
    big = asyncio.create_task(budget.acquire(70))
    small = asyncio.create_task(budget.acquire(30))
    await settle()
    big.cancel()
    await asyncio.wait_for(small, 1)
    assert big.cancelled()
    assert (budget.num_used, budget.num_holding, budget.num_waiting) == (90, 2, 0)


async def test_a_grant_cancelled_before_its_waiter_runs_is_given_back() -> None:
    budget = KvBudget(100)
    await budget.acquire(100)
    waiter = asyncio.create_task(budget.acquire(50))
    await settle()
    budget.release(100)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (budget.num_used, budget.num_holding) == (0, 0)


async def test_a_request_larger_than_the_cache_is_refused() -> None:
    with pytest.raises(InvalidArgument) as caught:
        await KvBudget(100).acquire(101)
    assert caught.value.reason == "KV_CACHE_TOO_SMALL"
    with pytest.raises(ValueError):
        KvBudget(0)


class TextConfig:
    num_hidden_layers, num_key_value_heads, hidden_size, num_attention_heads = 2, 1, 128, 2

    def get_text_config(self) -> TextConfig:
        return self


def test_capacity_counts_keys_and_values_of_every_layer() -> None:
    # NOTE: 2 (key, value) x 2 layers x 1 head x 64 wide x 4 bytes = 1 KiB a token.
    assert kv_capacity(TextConfig(), 256 << 20, 4) == 256 << 10
    assert kv_capacity(TextConfig(), 100, 4) == 1, "at least one token"


def test_a_cache_must_hold_one_request_of_the_longest_length() -> None:
    check_room(4096, 4096)
    with pytest.raises(ValueError, match="holds 4095 tokens.*at most 4095"):
        check_room(4095, 4096)
