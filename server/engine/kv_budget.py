"""KV-cache room shared by the requests of an engine that keeps one cache per request.

A request reserves room for its whole sequence (prompt and every token it may generate) before
it starts and gives it back when it ends, so a running request never runs out of room midway.
Reservations are granted first come, first served; one that does not fit waits, and the ones
behind it wait too (no starvation of long requests). Pure asyncio bookkeeping, no torch; the
capacity comes from the model's config (``kv_capacity``) and must hold one request of the
engine's longest length (``check_room``), as vLLM requires of its own cache.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from epd.common.errors import InvalidArgument


def kv_capacity(config: Any, kv_cache_bytes: int, itemsize: int) -> int:
    """Tokens of KV cache ``kv_cache_bytes`` hold for the model of transformers ``config``, at
    ``itemsize`` bytes a value (at least one)."""
    text = config.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    bytes_per_token = 2 * text.num_hidden_layers * text.num_key_value_heads * head_dim * itemsize
    return max(kv_cache_bytes // int(bytes_per_token), 1)


def check_room(capacity: int, max_model_len: int) -> None:
    """ValueError unless a KV cache of ``capacity`` tokens holds one request of
    ``max_model_len`` tokens, the check vLLM makes as it starts an engine."""
    if capacity < max_model_len:
        raise ValueError(
            f"the KV cache holds {capacity} tokens, fewer than one request of the maximum model "
            f"length ({max_model_len}) needs: give a larger KV cache, or a maximum model length "
            f"of at most {capacity}"
        )


class KvBudget:
    """``capacity`` tokens of KV cache; ``acquire`` waits for room, ``release`` gives it back."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"KV capacity must be positive, got {capacity}")
        self.capacity = capacity
        self.num_used = 0
        self.num_holding = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def num_waiting(self) -> int:
        """Requests waiting for room."""
        return len(self._waiters)

    @property
    def usage(self) -> float:
        """Reserved share of the capacity, 0 to 1."""
        return self.num_used / self.capacity

    async def acquire(self, num_tokens: int) -> None:
        """Reserve ``num_tokens``; waits while earlier requests or lack of room block it.

        Raises InvalidArgument when the request could never fit. Cancelled while waiting: no
        room is held.
        """
        if num_tokens > self.capacity:
            raise InvalidArgument(
                f"the request needs KV room for {num_tokens} tokens; the "
                f"engine's KV cache holds {self.capacity}",
                reason="KV_CACHE_TOO_SMALL",
            )
        if not self._waiters and self.num_used + num_tokens <= self.capacity:
            self._grant(num_tokens)
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append((num_tokens, waiter))
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(num_tokens)
            else:
                self._waiters.remove((num_tokens, waiter))
                self._wake()
            raise

    def release(self, num_tokens: int) -> None:
        """Give back a reservation ``acquire`` granted."""
        self.num_used -= num_tokens
        self.num_holding -= 1
        self._wake()

    def _grant(self, num_tokens: int) -> None:
        self.num_used += num_tokens
        self.num_holding += 1

    def _wake(self) -> None:
        while self._waiters and self.num_used + self._waiters[0][0] <= self.capacity:
            num_tokens, waiter = self._waiters.popleft()
            self._grant(num_tokens)
            waiter.set_result(None)
