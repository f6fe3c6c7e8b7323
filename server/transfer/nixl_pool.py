"""Registered host memory for the NIXL backend: pooled blocks and the lease-stamp arena.

A block is an anonymous page-aligned mapping registered with the process's NIXL agent once and
reused by power-of-two size class (registration costs more than a small transfer); its first 64
bytes hold the lease stamp a consumer checks after its READ. Lent tensors have no room for a
stamp, so theirs live in one registered arena of 64-byte slots.
"""

from __future__ import annotations

import mmap
import threading
from dataclasses import dataclass

import torch

from epd.server.transfer.idle_pool import DEFAULT_MAX_IDLE_BYTES, IdlePool
from epd.server.transfer.nixl_agent import NixlAgent
from epd.server.transfer.payload_layout import HEADER_BYTES, size_class, stamp_of

BLANK_STAMP = bytes(HEADER_BYTES)


@dataclass(slots=True)
class Block:
    """One registered buffer: a 64-byte stamp, then up to ``capacity - 64`` payload bytes;
    ``location`` names it in lease listings (``agent@address``)."""

    capacity: int
    memory: mmap.mmap
    view: torch.Tensor
    address: int
    location: str

    def stamp(self, lease_id: str) -> None:
        self.memory[:HEADER_BYTES] = stamp_of(lease_id)


class RegisteredPool:
    """Registered blocks by size class, reused after give_back; idle ones beyond
    ``max_idle_bytes`` (and all idle ones at ``close``) are deregistered."""

    def __init__(self, agent: NixlAgent, max_idle_bytes: int = DEFAULT_MAX_IDLE_BYTES) -> None:
        self._agent = agent
        self._idle: IdlePool[Block] = IdlePool(max_idle_bytes)
        self._lock = threading.Lock()
        self.num_outstanding = 0

    def acquire(self, num_bytes: int) -> Block:
        """A registered block with room for ``num_bytes`` of payload."""
        capacity = size_class(num_bytes)
        with self._lock:
            self.num_outstanding += 1
        block = self._idle.take(capacity)
        if block is not None:
            return block
        memory = mmap.mmap(-1, capacity)
        view = torch.frombuffer(memory, dtype=torch.uint8)
        address = view.data_ptr()
        block = Block(capacity, memory, view, address, f"{self._agent.name}@{address:#x}")
        self._agent.register(block.address, capacity)
        return block

    def give_back(self, block: Block) -> None:
        """Return ``block`` for reuse (its stamp is wiped first)."""
        block.memory[:HEADER_BYTES] = BLANK_STAMP
        with self._lock:
            self.num_outstanding -= 1
        if not self._idle.offer(block.capacity, block):
            self._agent.deregister(block.address)

    def close(self) -> None:
        """Deregister idle blocks; blocks still out are deregistered when they come back."""
        for block in self._idle.close():
            self._agent.deregister(block.address)


class StampArena:
    """One registered buffer of 64-byte lease stamps for lent tensors (which have no room for
    one): a slot is stamped on ``put`` and wiped when the lease ends. On ``device`` (a GPU) the
    arena is device memory, registered as VRAM: NIXL reads one memory type per transfer, so a
    lent device tensor's stamp lives beside it; writes to it are ordinary device copies, which
    the producer synchronizes before it publishes the reference."""

    def __init__(
        self, agent: NixlAgent, slots: int = 1024, device: torch.device | None = None
    ) -> None:
        self._agent = agent
        num_bytes = slots * HEADER_BYTES
        self._host = mmap.mmap(-1, num_bytes) if device is None else None
        self.slots = (
            torch.frombuffer(self._host, dtype=torch.uint8)
            if self._host is not None
            else torch.zeros(num_bytes, dtype=torch.uint8, device=device)
        )
        self.address = self.slots.data_ptr()
        if device is None:
            agent.register(self.address, num_bytes)
        else:
            agent.register(self.address, num_bytes, "VRAM", device.index or 0)
        self._free = list(range(slots))
        self._lock = threading.Lock()

    def take(self, lease_id: str) -> int | None:
        """A stamped slot's address, or None when all are in use."""
        with self._lock:
            if not self._free:
                return None
            slot = self._free.pop()
        offset = slot * HEADER_BYTES
        self._write(offset, stamp_of(lease_id))
        return self.address + offset

    def give_back(self, address: int) -> None:
        offset = address - self.address
        self._write(offset, BLANK_STAMP)
        with self._lock:
            self._free.append(offset // HEADER_BYTES)

    def _write(self, offset: int, stamp: bytes) -> None:
        if self._host is not None:
            self._host[offset : offset + HEADER_BYTES] = stamp
            return
        source = torch.frombuffer(bytearray(stamp), dtype=torch.uint8)
        self.slots[offset : offset + HEADER_BYTES].copy_(source)

    def close(self) -> None:
        self._agent.deregister(self.address)
