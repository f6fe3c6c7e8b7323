"""The NIXL backend: the producer keeps payloads in NIXL-registered buffers, the consumer READs.

Buffers are anonymous page-aligned mappings, registered once and pooled by power-of-two size
class, on both sides (registration per transfer would cost a round of metadata exchange). Memory
of a process that dies goes with it, so NIXL payloads cannot outlive their producer.

Wire layout: each payload sits behind a 64-byte lease stamp, and the reference's descriptors are
``[stamp (64 bytes), payload]``. The consumer READs both in one transfer and checks the stamp, so
a reference whose lease was released (and whose buffer now holds another tensor) fails with
NOT_FOUND instead of returning someone else's data. References whose descriptors add up to exactly
``byte_size`` (no stamp: another producer) are read as they are.

Release: the consumer's READ carries the notification ``epd-release:<lease id>``; the producer
frees the lease when it polls notifications (on ``put``, ``held``, ``reap_expired``: the reaper),
or earlier on ``release`` (the Release RPC). Both are idempotent.
"""

from __future__ import annotations

import ctypes
import mmap
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from epd.server.common.errors import InvalidArgument, NotFound
from epd.server.transfer.base import TensorConsumer, TensorProducer
from epd.server.transfer.leases import Clock, LeaseInfo, LeaseTable, attach_lease
from epd.server.transfer.nixl_agent import NixlAgent, Region, process_agent
from epd.server.transfer.shm import HEADER_BYTES, MAGIC, size_class
from epd.server.transfer.tensors import check_ref, copy_payload, describe
from epd.v1 import tensor_pb2

RELEASE_PREFIX = b"epd-release:"
MAX_DESCRIPTORS = 64
_MEMORY_TYPES = {tensor_pb2.NIXL_MEMORY_TYPE_UNSPECIFIED: "DRAM",
                 tensor_pb2.NIXL_MEMORY_TYPE_DRAM: "DRAM", tensor_pb2.NIXL_MEMORY_TYPE_VRAM: "VRAM"}
AgentFactory = Callable[[], NixlAgent]


@dataclass(slots=True)
class Block:
    """One registered buffer: a 64-byte stamp, then up to ``capacity - 64`` payload bytes."""

    capacity: int
    memory: mmap.mmap
    view: torch.Tensor
    address: int

    def stamp(self, lease_id: str) -> None:
        self.memory[:HEADER_BYTES] = (MAGIC + lease_id.encode()).ljust(HEADER_BYTES, b"\0")

    def is_stamped(self, lease_id: str) -> bool:
        return self.memory[:HEADER_BYTES] == (MAGIC + lease_id.encode()).ljust(HEADER_BYTES, b"\0")


class RegisteredPool:
    """Registered blocks by size class, reused after give_back; idle ones beyond
    ``max_idle_bytes`` (and all idle ones at ``close``) are deregistered."""

    def __init__(self, agent: NixlAgent, max_idle_bytes: int = 1 << 30) -> None:
        self._agent = agent
        self._max_idle = max_idle_bytes
        self._idle: dict[int, list[Block]] = defaultdict(list)
        self._idle_bytes = 0
        self._is_closed = False
        self._lock = threading.Lock()
        self.num_created = 0
        self.num_outstanding = 0

    def acquire(self, num_bytes: int) -> Block:
        """A registered block with room for ``num_bytes`` of payload."""
        capacity = size_class(num_bytes)
        with self._lock:
            self.num_outstanding += 1
            if self._idle[capacity]:
                self._idle_bytes -= capacity
                return self._idle[capacity].pop()
            self.num_created += 1
        memory = mmap.mmap(-1, capacity)
        view = torch.frombuffer(memory, dtype=torch.uint8)
        block = Block(capacity, memory, view, view.data_ptr())
        self._agent.register(block.address, capacity)
        return block

    def give_back(self, block: Block) -> None:
        """Return ``block`` for reuse (its stamp is wiped first)."""
        block.memory[:HEADER_BYTES] = bytes(HEADER_BYTES)
        with self._lock:
            self.num_outstanding -= 1
            if not self._is_closed and self._idle_bytes + block.capacity <= self._max_idle:
                self._idle[block.capacity].append(block)
                self._idle_bytes += block.capacity
                return
        self._agent.deregister(block.address)

    def close(self) -> None:
        """Deregister idle blocks; blocks still out are deregistered when they come back."""
        with self._lock:
            self._is_closed = True
            idle = [block for blocks in self._idle.values() for block in blocks]
            self._idle.clear()
            self._idle_bytes = 0
        for block in idle:
            self._agent.deregister(block.address)


class NixlProducer(TensorProducer):
    """Puts tensors into registered blocks under leases; frees them on release, on the
    consumer's notification, or on expiry. The agent is created on the first ``put``."""

    kind = "nixl"

    def __init__(self, host_id: str, *, producer_endpoint: str = "", ttl_s: float = 60.0,
                 clock: Clock = time.time, agent_factory: AgentFactory = process_agent,
                 max_idle_bytes: int = 1 << 30) -> None:  # fmt: skip
        self.host_id = host_id
        self.producer_endpoint = producer_endpoint
        self.ttl_s = ttl_s
        self._agent_factory = agent_factory
        self._max_idle = max_idle_bytes
        self._agent: NixlAgent | None = None
        self._pool: RegisteredPool | None = None
        self._leases: LeaseTable[Block] = LeaseTable(clock)
        self._lock = threading.Lock()

    def _ensure_started(self) -> tuple[NixlAgent, RegisteredPool]:
        with self._lock:
            if self._agent is None or self._pool is None:
                self._agent = self._agent_factory()
                self._pool = RegisteredPool(self._agent, self._max_idle)
                self._agent.add_listener(self._on_notification)
            return self._agent, self._pool

    def put(self, tensor: torch.Tensor, *, ttl_s: float | None = None) -> tensor_pb2.TensorRef:
        agent, pool = self._ensure_started()
        agent.poll()
        ref = describe(tensor)
        block = pool.acquire(ref.byte_size)
        copy_payload(block.address + HEADER_BYTES, tensor)
        info = self._leases.add(block, kind=self.kind, byte_size=ref.byte_size,
                                location=f"{agent.name}@{block.address:#x}",
                                ttl_s=ttl_s or self.ttl_s)  # fmt: skip
        block.stamp(info.lease_id)
        location = ref.nixl
        location.agent_name = agent.name
        location.agent_metadata = agent.metadata(block.address)
        location.memory_type = tensor_pb2.NIXL_MEMORY_TYPE_DRAM
        location.descriptors.add(address=block.address, length=HEADER_BYTES)
        if ref.byte_size:
            location.descriptors.add(address=block.address + HEADER_BYTES, length=ref.byte_size)
        return attach_lease(ref, info, self.host_id, self.producer_endpoint)

    def release(self, lease_id: str) -> bool:
        block = self._leases.pop(lease_id)
        if block is None:
            return False
        assert self._pool is not None
        self._pool.give_back(block)
        return True

    def held(self) -> list[LeaseInfo]:
        if self._agent is not None:
            self._agent.poll()
        return self._leases.held()

    def reap_expired(self) -> int:
        if self._agent is None or self._pool is None:
            return 0
        self._agent.poll()
        expired = self._leases.pop_expired()
        for block in expired:
            self._pool.give_back(block)
        return len(expired)

    def close(self) -> None:
        if self._agent is None or self._pool is None:
            return
        self._agent.remove_listener(self._on_notification)
        for block in self._leases.pop_all():
            self._pool.give_back(block)
        self._pool.close()

    @property
    def num_blocks_created(self) -> int:
        """Blocks created (and registered) so far; the pool reuses them."""
        return 0 if self._pool is None else self._pool.num_created

    def _on_notification(self, peer: str, message: bytes) -> None:
        if message.startswith(RELEASE_PREFIX):
            self.release(message[len(RELEASE_PREFIX):].decode(errors="replace"))


class NixlConsumer(TensorConsumer):
    """READs payloads into its own registered blocks. ``get`` returns a view of the block, which
    goes back to the pool when the last tensor viewing it is garbage collected (``copy=True``
    returns a private tensor at once). With ``release_after_read`` the READ notifies the producer,
    which frees the payload: read each reference once."""

    kind = "nixl"

    def __init__(self, *, agent_factory: AgentFactory = process_agent,
                 release_after_read: bool = True, timeout_s: float = 30.0,
                 max_idle_bytes: int = 1 << 30) -> None:  # fmt: skip
        self.release_after_read = release_after_read
        self.timeout_s = timeout_s
        self._agent_factory = agent_factory
        self._max_idle = max_idle_bytes
        self._agent: NixlAgent | None = None
        self._pool: RegisteredPool | None = None
        self._lock = threading.Lock()

    def _ensure_started(self) -> tuple[NixlAgent, RegisteredPool]:
        with self._lock:
            if self._agent is None or self._pool is None:
                self._agent = self._agent_factory()
                self._pool = RegisteredPool(self._agent, self._max_idle)
            return self._agent, self._pool

    def get(self, ref: tensor_pb2.TensorRef, *, copy: bool = False) -> torch.Tensor:
        dtype = check_ref(ref)
        remote, is_stamped = remote_regions(ref)
        agent, pool = self._ensure_started()
        agent.connect(ref.nixl.agent_name, ref.nixl.agent_metadata)
        block = pool.acquire(ref.byte_size)
        local = mirror(remote, block.address if is_stamped else block.address + HEADER_BYTES)
        notification = RELEASE_PREFIX + ref.lease_id.encode() if self.release_after_read else b""
        try:
            agent.read(local, remote, ref.nixl.agent_name, notification=notification,
                       remote_memory_type=_MEMORY_TYPES[ref.nixl.memory_type],
                       timeout_s=self.timeout_s)  # fmt: skip
            if is_stamped and not block.is_stamped(ref.lease_id):
                raise NotFound(f"lease {ref.lease_id} was released: its NIXL buffer no longer "
                               "holds the payload", reason="LEASE_RELEASED")  # fmt: skip
        except BaseException:
            pool.give_back(block)
            raise
        return self._lend(pool, block, ref, dtype, copy)

    def _lend(self, pool: RegisteredPool, block: Block, ref: tensor_pb2.TensorRef,
              dtype: torch.dtype, copy: bool) -> torch.Tensor:  # fmt: skip
        shape = tuple(ref.shape)
        if copy or ref.byte_size == 0:
            payload = block.view[HEADER_BYTES:HEADER_BYTES + ref.byte_size].clone()
            pool.give_back(block)
            return payload.view(dtype).reshape(shape)
        # NOTE: the ctypes array is the buffer the tensor's storage keeps alive; when the last view
        # dies, the array dies and the finalizer hands the block back.
        array = (ctypes.c_char * (HEADER_BYTES + ref.byte_size)).from_buffer(block.memory)
        weakref.finalize(array, pool.give_back, block)
        payload = torch.frombuffer(array, dtype=torch.uint8, offset=HEADER_BYTES,
                                   count=ref.byte_size)  # fmt: skip
        return payload.view(dtype).reshape(shape)

    @property
    def num_outstanding(self) -> int:
        """Receive blocks in use: READs in flight plus tensors still viewing a block."""
        return 0 if self._pool is None else self._pool.num_outstanding

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()


def mirror(remote: list[Region], start: int) -> list[Region]:
    """Local regions of the same lengths as ``remote``, laid end to end from ``start``."""
    local = []
    for _, length, _ in remote:
        local.append((start, length, 0))
        start += length
    return local


def remote_regions(ref: tensor_pb2.TensorRef) -> tuple[list[Region], bool]:
    """The integer descriptors of ``ref.nixl`` checked against its byte size, and whether they
    start with an epd lease stamp. Raises InvalidArgument for anything malformed."""
    location = ref.nixl
    if not location.agent_name:
        raise InvalidArgument("NIXL location has no agent name", reason="BAD_TENSOR_REF")
    if location.memory_type not in _MEMORY_TYPES:
        raise InvalidArgument(f"unknown NIXL memory type {location.memory_type}",
                              reason="BAD_TENSOR_REF")  # fmt: skip
    if len(location.descriptors) > MAX_DESCRIPTORS:
        raise InvalidArgument(f"{len(location.descriptors)} NIXL descriptors (limit "
                              f"{MAX_DESCRIPTORS})", reason="BAD_TENSOR_REF")  # fmt: skip
    regions = [(d.address, d.length, d.device_id) for d in location.descriptors]
    lengths = [length for _, length, _ in regions]
    if not regions or min(lengths) == 0:
        raise InvalidArgument("NIXL descriptors must be non-empty regions",
                              reason="BAD_TENSOR_REF")  # fmt: skip
    total = sum(lengths)
    if total == ref.byte_size + HEADER_BYTES and regions[0][1] == HEADER_BYTES:
        return regions, True
    if total == ref.byte_size:
        return regions, False
    raise InvalidArgument(f"NIXL descriptors cover {total} bytes, the TensorRef says "
                          f"{ref.byte_size}", reason="TENSOR_SIZE_MISMATCH")  # fmt: skip
