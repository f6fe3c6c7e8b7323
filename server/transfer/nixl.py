"""The NIXL backend: the producer keeps payloads in NIXL-registered buffers, the consumer READs
(``nixl_consumer``).

Buffers are anonymous page-aligned mappings, registered once and pooled by power-of-two size
class, on both sides. Tensors of 1 MiB or more are not copied on the producer side: their own
memory is registered for the lease (registering costs about as much as copying a MiB) and their
stamp sits in a registered arena of slots. Memory
of a process that dies goes with it, so NIXL payloads cannot outlive their producer.

GPU memory: a tensor on a CUDA device, for a consumer that reads into a GPU, is lent from device
memory (``lend_from_device``): the tensor is registered as VRAM and its stamp sits in a
registered device arena, because NIXL reads one memory type per transfer. The consumer READs it
into a new tensor on its own GPU (``get_on``), device to device (UCX's CUDA transports: IPC on one
host, GPUDirect RDMA across hosts where the NICs have it). Where NIXL cannot register GPU memory
(a build without CUDA), the producer stages to a host block once and the consumer reads into host
memory and copies up once.

Wire layout: each payload sits behind a 64-byte lease stamp (``payload_layout``). A pooled
block's stamp and payload are contiguous and travel as one descriptor ``[stamp + payload]``; a
lent tensor's as ``[stamp slot (64 bytes), payload]``. The consumer READs them in one transfer
and checks the stamp, so a reference whose lease was released (and whose buffer now holds another
tensor) fails with NOT_FOUND instead of returning someone else's data. References whose
descriptors add up to exactly ``byte_size`` (no stamp: another producer) are read as they are.

Release: once its READ is done, the consumer notifies the producer with ``epd-release:<lease
id>``; the producer frees the lease when its agent's polling thread delivers it (within a polling
interval; ``held`` and ``reap_expired`` poll too), or earlier on ``release`` (the Release RPC).
Both are idempotent.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from epd.server.transfer.base import LeasedProducer, LeaseInfo, ProducerSettings
from epd.server.transfer.nixl_agent import NixlAgent, process_agent
from epd.server.transfer.nixl_pool import Block, RegisteredPool, StampArena
from epd.server.transfer.payload_layout import HEADER_BYTES
from epd.server.transfer.tensors import copy_payload, describe
from epd.v1 import tensor_pb2

if TYPE_CHECKING:
    from typing_extensions import Unpack

logger = logging.getLogger(__name__)

RELEASE_PREFIX = b"epd-release:"
AgentFactory = Callable[[], NixlAgent]


class StartedOnUse:
    """A NIXL agent and its pool of registered blocks, made on first use from any thread;
    ``on_start`` runs once with the new agent before any caller gets it."""

    def __init__(
        self,
        agent_factory: AgentFactory,
        max_idle_bytes: int,
        on_start: Callable[[NixlAgent], None] | None = None,
    ) -> None:
        self._agent_factory = agent_factory
        self._max_idle = max_idle_bytes
        self._on_start = on_start
        self._lock = threading.Lock()
        self.started: tuple[NixlAgent, RegisteredPool] | None = None
        """The agent and its pool once made; None before."""

    def get(self) -> tuple[NixlAgent, RegisteredPool]:
        """The agent and its pool, made now if they are not yet."""
        started = self.started
        if started is not None:
            return started
        with self._lock:
            if self.started is None:
                agent = self._agent_factory()
                pool = RegisteredPool(agent, self._max_idle)
                if self._on_start is not None:
                    self._on_start(agent)
                self.started = (agent, pool)
            return self.started


@dataclass(slots=True)
class Lent:
    """A caller's tensor registered in place (zero-copy), with its stamp slot and arena."""

    tensor: torch.Tensor
    stamp_address: int
    stamps: StampArena


class NixlProducer(LeasedProducer[Block | Lent]):
    """Puts tensors under leases; frees them on release, on the consumer's notification, or on
    expiry. The agent is created on the first ``put``.

    Tensors of ``zero_copy_min_bytes`` or more (contiguous, host memory) are lent, not copied:
    their memory is registered in place for the lease (registration costs about as much as
    copying a MiB) and the producer keeps a reference to them, so the caller must not modify
    them in place until the lease ends. Smaller ones are copied into pooled registered blocks.
    """

    kind = "nixl"

    def __init__(
        self,
        host_id: str,
        *,
        agent_factory: AgentFactory = process_agent,
        zero_copy_min_bytes: int = 1 << 20,
        **settings: Unpack[ProducerSettings],
    ) -> None:
        super().__init__(host_id, **settings)
        self.zero_copy_min_bytes = zero_copy_min_bytes
        self._nixl = StartedOnUse(
            agent_factory,
            self.max_idle_bytes,
            on_start=lambda agent: agent.add_listener(self._on_notification),
        )
        self._stamps: dict[torch.device | None, StampArena] = {}
        self._lock = threading.Lock()
        self.lends_device_memory: bool | None = None
        """Whether this process's NIXL registers GPU memory: None until first tried."""

    def put(self, tensor: torch.Tensor, *, ttl_s: float | None = None) -> tensor_pb2.TensorRef:
        agent, pool = self._nixl.get()
        ref = describe(tensor)
        if tensor.is_cpu and ref.byte_size >= max(1, self.zero_copy_min_bytes):
            lent = self._lend(agent, tensor, ref.byte_size, ttl_s)
            if lent is not None:
                return lent
        return self._copied(agent, pool, tensor, ref, ttl_s)

    def _copied(
        self,
        agent: NixlAgent,
        pool: RegisteredPool,
        tensor: torch.Tensor,
        ref: tensor_pb2.TensorRef,
        ttl_s: float | None,
    ) -> tensor_pb2.TensorRef:
        """``tensor`` copied (a device tensor staged once) into a pooled host block."""
        block = pool.acquire(ref.byte_size)
        copy_payload(block.address + HEADER_BYTES, tensor)
        info = self._lease(ref, block, block.location, ttl_s)
        block.stamp(info.lease_id)
        location = ref.nixl
        location.agent_name = agent.name
        location.agent_metadata = agent.metadata(block.address)
        location.memory_type = tensor_pb2.NIXL_MEMORY_TYPE_DRAM
        location.descriptors.add(address=block.address, length=HEADER_BYTES + ref.byte_size)
        return ref

    def lend_from_device(
        self, tensor: torch.Tensor, *, ttl_s: float | None = None
    ) -> tensor_pb2.TensorRef:
        """Like ``put`` for a tensor in GPU memory that a consumer reads into GPU memory: the
        tensor is lent in place (registered as VRAM, its stamp in a device arena) whatever its
        size, so it never crosses to the host here. Where this NIXL cannot register GPU memory
        (a build without CUDA), or the tensor is not a contiguous CUDA tensor, it is staged to
        a host block once, as ``put`` does; the first refusal is logged and remembered."""
        agent, pool = self._nixl.get()
        ref = describe(tensor)
        if tensor.device.type == "cuda" and self.lends_device_memory is not False:
            try:
                lent = self._lend(agent, tensor, ref.byte_size, ttl_s)
            except Exception as e:  # noqa: BLE001 - nixl raises its own types for unsupported memory
                logger.warning(
                    "NIXL cannot register GPU memory here (%s); device tensors are staged to "
                    "host memory once instead",
                    e,
                )
                self.lends_device_memory = False
            else:
                if lent is not None:
                    self.lends_device_memory = True
                    return lent
        return self._copied(agent, pool, tensor, ref, ttl_s)

    def _lend(
        self, agent: NixlAgent, tensor: torch.Tensor, byte_size: int, ttl_s: float | None
    ) -> tensor_pb2.TensorRef | None:
        """Register ``tensor`` (host or CUDA memory, contiguous, not empty) in place under a
        lease, or None (then it is copied)."""
        on_device = tensor.device.type == "cuda"
        if not byte_size or not tensor.is_contiguous() or not (on_device or tensor.is_cpu):
            return None
        device = tensor.device if on_device else None
        memory_type = "VRAM" if on_device else "DRAM"
        device_id = (tensor.device.index or 0) if on_device else 0
        with self._lock:
            stamps = self._stamps.get(device)
            if stamps is None:
                stamps = self._stamps[device] = StampArena(agent, device=device)
        address = tensor.data_ptr()
        if not agent.share(address, byte_size, memory_type, device_id):
            return None
        lent = Lent(tensor, 0, stamps)
        ref = describe(tensor)
        info = self._lease(ref, lent, f"{agent.name}@{address:#x}", ttl_s)
        stamp = stamps.take(info.lease_id)
        if stamp is None:
            self.release(info.lease_id)  # NOTE: unshares the tensor; it had no stamp to give back
            return None
        lent.stamp_address = stamp
        if on_device:
            # NOTE: the tower's kernels and the stamp's copy may still be queued; a peer may READ
            # as soon as it holds the reference.
            torch.cuda.synchronize(tensor.device)
        location = ref.nixl
        location.agent_name = agent.name
        location.agent_metadata = agent.metadata_of([stamps.address, address])
        location.memory_type = (
            tensor_pb2.NIXL_MEMORY_TYPE_VRAM if on_device else tensor_pb2.NIXL_MEMORY_TYPE_DRAM
        )
        location.descriptors.add(address=stamp, length=HEADER_BYTES, device_id=device_id)
        location.descriptors.add(address=address, length=byte_size, device_id=device_id)
        return ref

    def _free(self, payload: Block | Lent) -> None:
        agent, pool = self._nixl.get()  # NOTE: made already: every payload came from them
        if isinstance(payload, Lent):
            if payload.stamp_address:
                payload.stamps.give_back(payload.stamp_address)
            agent.unshare(payload.tensor.data_ptr())
            return
        pool.give_back(payload)

    def held(self) -> list[LeaseInfo]:
        if self._nixl.started is not None:
            self._nixl.started[0].poll()
        return super().held()

    def reap_expired(self) -> int:
        if self._nixl.started is None:
            return 0
        self._nixl.started[0].poll()
        return super().reap_expired()

    def close(self) -> None:
        if self._nixl.started is None:
            return
        agent, pool = self._nixl.started
        agent.remove_listener(self._on_notification)
        super().close()
        pool.close()
        for stamps in self._stamps.values():
            stamps.close()
        self._stamps.clear()

    def _on_notification(self, peer: str, message: bytes) -> None:
        if message.startswith(RELEASE_PREFIX):
            self.release(message[len(RELEASE_PREFIX) :].decode(errors="replace"))
