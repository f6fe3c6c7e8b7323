"""The NIXL backend's consumer: READs payloads into its own registered blocks (or into GPU
memory), checks their lease stamp and notifies the producer. Wire layout, lifetimes and release
are described in ``nixl``.
"""

from __future__ import annotations

import ctypes
import logging
import weakref

import torch

from epd.common.errors import InvalidArgument
from epd.server.transfer.base import TensorConsumer
from epd.server.transfer.idle_pool import DEFAULT_MAX_IDLE_BYTES, WarmBuffers
from epd.server.transfer.nixl import RELEASE_PREFIX, AgentFactory, StartedOnUse
from epd.server.transfer.nixl_agent import NixlAgent, Region, process_agent
from epd.server.transfer.nixl_pool import Block, RegisteredPool
from epd.server.transfer.payload_layout import HEADER_BYTES, check_stamp
from epd.server.transfer.tensors import (
    check_layout,
    move,
    shaped,
    view_bytes,
)
from epd.v1 import tensor_pb2

logger = logging.getLogger(__name__)

MAX_DESCRIPTORS = 64
# Payloads up to this size are returned as private copies: a copy costs less than the view's
# bookkeeping (a ctypes buffer and a finalizer) and gives the receive block back at once.
SMALL_COPY_BYTES = 16 << 10
_MEMORY_TYPES = {
    tensor_pb2.NIXL_MEMORY_TYPE_UNSPECIFIED: "DRAM",
    tensor_pb2.NIXL_MEMORY_TYPE_DRAM: "DRAM",
    tensor_pb2.NIXL_MEMORY_TYPE_VRAM: "VRAM",
}
Regions = tuple[Region, ...]


class NixlConsumer(TensorConsumer):
    """READs payloads into its own registered blocks. ``get`` returns a view of the block, which
    goes back to the pool when the last tensor viewing it is garbage collected (``copy=True``
    and payloads up to 16 KiB return a private tensor at once). With ``release_after_read`` a
    done READ notifies the producer, which frees the payload: read each reference once."""

    kind = "nixl"

    def __init__(
        self,
        *,
        agent_factory: AgentFactory = process_agent,
        release_after_read: bool = True,
        timeout_s: float = 30.0,
        max_idle_bytes: int = DEFAULT_MAX_IDLE_BYTES,
    ) -> None:
        self.release_after_read = release_after_read
        self.timeout_s = timeout_s
        self._nixl = StartedOnUse(agent_factory, max_idle_bytes)
        self.buffers = WarmBuffers()
        self.reads_into_device: bool | None = None
        """Whether this process's NIXL registers GPU memory to READ into: None until tried."""

    def get(self, ref: tensor_pb2.TensorRef, *, copy: bool = False) -> torch.Tensor:
        dtype, shape = check_layout(ref)
        agent_name, memory_type, remote, is_stamped = remote_payload(ref)
        agent, pool = self._nixl.get()
        lease_id, byte_size = ref.lease_id, ref.byte_size
        agent.connect(agent_name, ref.nixl.agent_metadata)
        block = pool.acquire(byte_size)
        local = mirror(remote, block.address if is_stamped else block.address + HEADER_BYTES)
        try:
            self._read(agent, ref, local, remote, memory_type)
            if is_stamped:
                check_stamp(block.memory[:HEADER_BYTES], lease_id, "its NIXL buffer")
            # NOTE: a small payload is copied into a bytearray that torch.frombuffer wraps: no
            # torch.empty, which costs more as the first tensor call of a process just woken.
            small = (
                bytearray(memoryview(block.memory)[HEADER_BYTES : HEADER_BYTES + byte_size])
                if byte_size <= SMALL_COPY_BYTES
                else None
            )
        except BaseException:
            pool.give_back(block)
            raise
        if small is None:
            return self._lend(pool, block, dtype, shape, byte_size, copy)
        pool.give_back(block)
        return view_bytes(small, dtype, shape, byte_size)

    def _lend(
        self,
        pool: RegisteredPool,
        block: Block,
        dtype: torch.dtype,
        shape: list[int],
        byte_size: int,
        copy: bool,
    ) -> torch.Tensor:
        if copy:
            payload = self.buffers.empty(dtype, shape, byte_size)
            move(payload.data_ptr(), block.address + HEADER_BYTES, byte_size)
            pool.give_back(block)
            return payload
        # NOTE: the ctypes array is the buffer the tensor's storage keeps alive; when the last view
        # dies, the array dies and the finalizer hands the block back.
        array = (ctypes.c_char * (HEADER_BYTES + byte_size)).from_buffer(block.memory)
        weakref.finalize(array, pool.give_back, block)
        payload = torch.frombuffer(array, dtype=torch.uint8, offset=HEADER_BYTES, count=byte_size)
        return shaped(payload.view(dtype), shape)

    def get_on(self, ref: tensor_pb2.TensorRef, device: torch.device) -> torch.Tensor:
        """READ the payload straight into a new tensor on GPU ``device`` (registered as VRAM for
        the READ, whatever memory the producer lent), checking its stamp there. Where this NIXL
        cannot register GPU memory, or ``device`` is no CUDA device, the payload is read into
        host memory and copied up once; the first refusal is logged and remembered."""
        if device.type != "cuda" or self.reads_into_device is False:
            return super().get_on(ref, device)
        dtype, shape = check_layout(ref)
        agent_name, memory_type, remote, is_stamped = remote_payload(ref)
        agent, _ = self._nixl.get()
        agent.connect(agent_name, ref.nixl.agent_metadata)
        byte_size, device_id = ref.byte_size, device.index or 0
        buffer = torch.empty(HEADER_BYTES + byte_size, dtype=torch.uint8, device=device)
        address = buffer.data_ptr()
        try:
            agent.register(address, HEADER_BYTES + byte_size, "VRAM", device_id)
        except Exception as e:  # noqa: BLE001 - nixl raises its own types for unsupported memory
            logger.warning(
                "NIXL cannot register GPU memory here (%s); payloads are read into host memory "
                "and copied to %s instead",
                e,
                device,
            )
            self.reads_into_device = False
            return super().get_on(ref, device)
        self.reads_into_device = True
        start = address if is_stamped else address + HEADER_BYTES
        try:
            self._read(agent, ref, mirror(remote, start, device_id), remote, memory_type, "VRAM")
        finally:
            agent.deregister(address)
        if is_stamped:
            check_stamp(bytes(buffer[:HEADER_BYTES].cpu().numpy()), ref.lease_id, "its NIXL buffer")
        return shaped(buffer[HEADER_BYTES:].view(dtype), shape)

    def _read(
        self,
        agent: NixlAgent,
        ref: tensor_pb2.TensorRef,
        local: Regions,
        remote: Regions,
        memory_type: str,
        local_memory_type: str = "DRAM",
    ) -> None:
        """READ ``remote`` of the reference's agent into ``local``; then, with
        ``release_after_read``, tell the producer it may free the payload."""
        agent_name = ref.nixl.agent_name
        agent.read(
            local,
            remote,
            agent_name,
            remote_memory_type=memory_type,
            local_memory_type=local_memory_type,
            timeout_s=self.timeout_s,
        )
        if self.release_after_read:
            agent.notify(agent_name, RELEASE_PREFIX + ref.lease_id.encode())

    @property
    def num_outstanding(self) -> int:
        """Receive blocks in use: READs in flight plus tensors still viewing a block."""
        return 0 if self._nixl.started is None else self._nixl.started[1].num_outstanding

    def close(self) -> None:
        self.buffers.close()
        if self._nixl.started is not None:
            self._nixl.started[1].close()


def mirror(remote: Regions, start: int, device_id: int = 0) -> Regions:
    """Local regions of the same lengths as ``remote``, laid end to end from ``start`` (in the
    memory of device ``device_id``)."""
    if len(remote) == 1:
        return ((start, remote[0][1], device_id),)
    local = []
    for _, length, _ in remote:
        local.append((start, length, device_id))
        start += length
    return tuple(local)


def remote_payload(ref: tensor_pb2.TensorRef) -> tuple[str, str, Regions, bool]:
    """``ref.nixl`` checked against the reference's byte size: (agent name, memory type, integer
    descriptors, whether they start with an epd lease stamp). Stamped descriptors cover exactly
    ``byte_size`` + 64 bytes, the first region at least the stamp. Raises InvalidArgument for
    anything malformed (and for a reference without a location)."""
    location = ref.nixl
    agent_name = location.agent_name
    if not agent_name:
        if ref.WhichOneof("location") is None:
            raise InvalidArgument(
                "TensorRef has no location (shm, nixl or inline_data)", reason="BAD_TENSOR_REF"
            )
        raise InvalidArgument("NIXL location has no agent name", reason="BAD_TENSOR_REF")
    memory_type = _MEMORY_TYPES.get(location.memory_type)
    if memory_type is None:
        raise InvalidArgument(
            f"unknown NIXL memory type {location.memory_type}", reason="BAD_TENSOR_REF"
        )
    # NOTE: slicing a repeated field is much faster than iterating it (upb).
    descriptors = location.descriptors[:]
    if len(descriptors) > MAX_DESCRIPTORS:
        raise InvalidArgument(
            f"{len(descriptors)} NIXL descriptors (limit {MAX_DESCRIPTORS})",
            reason="BAD_TENSOR_REF",
        )
    regions = tuple([(d.address, d.length, d.device_id) for d in descriptors])
    if not regions:
        raise _empty_region()
    total = 0
    for _, length, _ in regions:
        if not length:
            raise _empty_region()
        total += length
    byte_size = ref.byte_size
    if total == byte_size + HEADER_BYTES and regions[0][1] >= HEADER_BYTES:
        return agent_name, memory_type, regions, True
    if total == byte_size:
        return agent_name, memory_type, regions, False
    raise InvalidArgument(
        f"NIXL descriptors cover {total} bytes, the TensorRef says {byte_size}",
        reason="TENSOR_SIZE_MISMATCH",
    )


def _empty_region() -> InvalidArgument:
    return InvalidArgument("NIXL descriptors must be non-empty regions", reason="BAD_TENSOR_REF")
