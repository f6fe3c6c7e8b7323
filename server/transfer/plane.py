"""One data plane per process: picks the backend for each handoff and frees what is not released.

Choice for ``put``: an explicit preference (argument, or ``forced_kind`` for the whole process)
wins; otherwise NIXL from device memory when the tensor is on an accelerator, the consumer reads
into one too and this process's NIXL can register device memory (even on one host: no trip
through host memory); else shared memory when the consumer's host id equals ours, NIXL when the
consumer is on another known host and NIXL is enabled here, else inline (also for an empty, i.e.
unknown, consumer host id: such a consumer may not have NIXL). Every backend stages a device
tensor to host memory once, straight into the memory it hands over. ``get`` dispatches on the
reference's location, and reads into the device asked for. A background reaper frees payloads
whose lease expired (and NIXL payloads whose consumer notified that it has read them), so a
consumer that dies never leaks producer memory.
NIXL costs nothing until first used: the process's agent is created then.
"""

from __future__ import annotations

import functools
import logging
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

import torch

from epd.common.errors import FailedPrecondition, InvalidArgument, NotFound
from epd.server.transfer.base import DEFAULT_LEASE_TTL_S, LeaseInfo, TensorConsumer, TensorProducer
from epd.server.transfer.inline import InlineConsumer, InlineProducer
from epd.server.transfer.nixl import NixlProducer
from epd.server.transfer.nixl_agent import is_available as is_nixl_available
from epd.server.transfer.nixl_agent import process_agent
from epd.server.transfer.nixl_consumer import NixlConsumer
from epd.server.transfer.options import NixlOptions, TransferOptions
from epd.server.transfer.shm import ShmConsumer, ShmProducer
from epd.server.transfer.shm_leftovers import cleanup_leftovers
from epd.server.transfer.shm_mappings import DEFAULT_MAX_BYTES
from epd.v1 import tensor_pb2

logger = logging.getLogger(__name__)

KIND_NAMES: dict[int, str] = {
    tensor_pb2.TRANSFER_KIND_SHM: "shm",
    tensor_pb2.TRANSFER_KIND_NIXL: "nixl",
    tensor_pb2.TRANSFER_KIND_INLINE: "inline",
}
KINDS_BY_NAME = {name: kind for kind, name in KIND_NAMES.items()}
ALL_KINDS = ("shm", "nixl", "inline")
# How often the reaper unlinks shared-memory segments of dead producers on this host.
ORPHAN_SWEEP_S = 10.0


def default_host_id() -> str:
    """Hostname plus boot id: equal exactly for processes sharing /dev/shm (unless a container
    gives each its own; then ``--host-id`` tells them apart)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()[:8]
    except OSError:
        boot = "noboot"
    return f"{socket.gethostname()}:{boot}"


def is_accelerator(device: str) -> bool:
    """Whether ``device`` (a torch device name; empty means host memory) is not the CPU."""
    return bool(device) and not device.startswith("cpu")


def parse_kind(name: str) -> int:
    """TransferKind for "shm", "nixl", "inline" or "auto" (UNSPECIFIED)."""
    if name in ("", "auto"):
        return tensor_pb2.TRANSFER_KIND_UNSPECIFIED
    if name not in KINDS_BY_NAME:
        raise ValueError(f"unknown transfer kind {name!r}: use auto, shm, nixl or inline")
    return KINDS_BY_NAME[name]


class DataPlane:
    """Producer and consumer of every available backend, for one process."""

    def __init__(
        self,
        host_id: str | None = None,
        *,
        producer_endpoint: str = "",
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        max_inline_bytes: int = 8 << 20,
        forced_kind: str | None = None,
        kinds: tuple[str, ...] = ALL_KINDS,
        max_mapped_bytes: int = DEFAULT_MAX_BYTES,
        nixl: NixlOptions | None = None,
    ) -> None:
        """``kinds`` lists the backends this process offers (nixl is dropped when the package is
        missing); ``forced_kind`` overrides the automatic choice; ``max_mapped_bytes`` bounds
        what the shm consumer keeps mapped; ``nixl`` configures the process's NIXL agent if
        this plane is the first to create it."""
        unknown = set(kinds) - set(ALL_KINDS)
        if unknown:
            raise ValueError(f"unknown transfer kinds {sorted(unknown)}: use {ALL_KINDS}")
        self.host_id = host_id or default_host_id()
        self.max_inline_bytes = max_inline_bytes
        self.forced_kind = parse_kind(forced_kind or "")
        self.producers: dict[int, TensorProducer] = {}
        self.consumers: dict[str, TensorConsumer] = {}
        if "shm" in kinds:
            self.producers[tensor_pb2.TRANSFER_KIND_SHM] = ShmProducer(
                self.host_id, producer_endpoint=producer_endpoint, ttl_s=lease_ttl_s
            )
            self.consumers["shm"] = ShmConsumer(self.host_id, max_mapped_bytes=max_mapped_bytes)
        if "nixl" in kinds and is_nixl_available():
            agent = functools.partial(process_agent, nixl or NixlOptions())
            self.producers[tensor_pb2.TRANSFER_KIND_NIXL] = NixlProducer(
                self.host_id,
                producer_endpoint=producer_endpoint,
                ttl_s=lease_ttl_s,
                agent_factory=agent,
            )
            self.consumers["nixl"] = NixlConsumer(agent_factory=agent)
        if "inline" in kinds:
            self.producers[tensor_pb2.TRANSFER_KIND_INLINE] = InlineProducer()
            self.consumers["inline_data"] = InlineConsumer()
        self._bytes_moved: Counter[tuple[str, str]] = Counter()
        self._leases_expired: Counter[str] = Counter()
        self._counts_lock = threading.Lock()
        self._reaper: threading.Thread | None = None
        self._stop = threading.Event()

    @classmethod
    def from_options(cls, options: TransferOptions, **settings: Any) -> DataPlane:
        """A plane with the process's ``options`` and the role's own ``settings`` (keyword
        arguments of the constructor: kinds, leases, forced kind)."""
        return cls(
            options.host_id or None,
            max_mapped_bytes=options.shm_mapped_bytes,
            nixl=options.nixl,
            **settings,
        )

    def set_producer_endpoint(self, endpoint: str) -> None:
        """Where consumers release leases (known once the server has bound its port)."""
        for producer in self.producers.values():
            if isinstance(producer, ShmProducer | NixlProducer):
                producer.producer_endpoint = endpoint

    def choose(
        self,
        consumer_host_id: str,
        preferred: int,
        *,
        on_device: bool = False,
        consumer_device: str = "",
    ) -> int:
        """The backend for a handoff to ``consumer_host_id`` of a tensor in device memory
        (``on_device``) or host memory, read into ``consumer_device`` (see the module
        docstring)."""
        kind = preferred or self.forced_kind
        if not kind and on_device and is_accelerator(consumer_device):
            nixl = self.producers.get(tensor_pb2.TRANSFER_KIND_NIXL)
            if isinstance(nixl, NixlProducer) and nixl.lends_device_memory is not False:
                kind = tensor_pb2.TRANSFER_KIND_NIXL
        if not kind:
            if consumer_host_id == self.host_id and tensor_pb2.TRANSFER_KIND_SHM in self.producers:
                kind = tensor_pb2.TRANSFER_KIND_SHM
            elif consumer_host_id and tensor_pb2.TRANSFER_KIND_NIXL in self.producers:
                kind = tensor_pb2.TRANSFER_KIND_NIXL
            else:
                kind = tensor_pb2.TRANSFER_KIND_INLINE
        if kind not in self.producers:
            raise FailedPrecondition(
                f"transfer kind {KIND_NAMES.get(int(kind), kind)} is not available in this process",
                reason="TRANSFER_UNAVAILABLE",
            )
        return kind

    def put(
        self,
        tensor: torch.Tensor,
        consumer_host_id: str = "",
        *,
        consumer_device: str = "",
        preferred: int = tensor_pb2.TRANSFER_KIND_UNSPECIFIED,
        ttl_s: float | None = None,
        content_tag: bytes = b"",
    ) -> tensor_pb2.TensorRef:
        """Hand ``tensor`` (host or device memory) over for a consumer on ``consumer_host_id``
        that reads it into ``consumer_device`` (empty: host memory); returns the reference.
        ``content_tag`` names the payload for ``get(..., content_tag=)`` where it goes into shared
        memory; other backends carry none (a reader that expects one then finds none)."""
        on_device = tensor.device.type == "cuda"  # NOTE: the device memory NIXL registers
        kind = self.choose(
            consumer_host_id, preferred, on_device=on_device, consumer_device=consumer_device
        )
        if kind == tensor_pb2.TRANSFER_KIND_INLINE and tensor.nbytes > self.max_inline_bytes:
            raise InvalidArgument(
                f"{tensor.nbytes} bytes is too large to send inline (limit "
                f"{self.max_inline_bytes}); run producer and consumer on one "
                "host or enable nixl",
                reason="INLINE_TOO_LARGE",
            )
        # NOTE: detach() only where it changes something: each is a dispatched tensor call (a few
        # us warm, several times that in a process just woken by a request).
        if tensor.requires_grad:
            tensor = tensor.detach()
        producer = self.producers[kind]
        if content_tag and isinstance(producer, ShmProducer):
            ref = producer.put(tensor, ttl_s=ttl_s, content_tag=content_tag)
        elif isinstance(producer, NixlProducer) and on_device and is_accelerator(consumer_device):
            ref = producer.lend_from_device(tensor, ttl_s=ttl_s)
        else:
            ref = producer.put(tensor, ttl_s=ttl_s)
        with self._counts_lock:
            self._bytes_moved[KIND_NAMES[kind], "put"] += ref.byte_size
        return ref

    def get(
        self,
        ref: tensor_pb2.TensorRef,
        *,
        copy: bool = False,
        device: str = "",
        content_tag: bytes = b"",
    ) -> torch.Tensor:
        """The tensor behind ``ref``: a view valid until its lease is released, or a copy; on
        ``device`` (an accelerator) a tensor of its own there, read straight into it where the
        backend can (NIXL with device memory), else copied up from the host view. With
        ``content_tag``, only a shared-memory payload its producer tagged so (else
        FailedPrecondition: CONTENT_MISMATCH)."""
        location = ref.WhichOneof("location")
        expire_time_ms = ref.lease_expire_time_ms
        if expire_time_ms and expire_time_ms < time.time() * 1000:
            raise NotFound(f"lease {ref.lease_id} expired", reason="LEASE_EXPIRED")
        consumer = self.consumers.get(location or "")
        if consumer is None:
            raise InvalidArgument(
                f"this process cannot read {location or 'a missing'} location",
                reason="BAD_TENSOR_REF",
            )
        if content_tag:
            if not isinstance(consumer, ShmConsumer):
                raise FailedPrecondition(
                    f"a {location} payload carries no content tag", reason="CONTENT_MISMATCH"
                )
            tensor = consumer.get(ref, copy=copy, content_tag=content_tag)
        elif is_accelerator(device):
            tensor = consumer.get_on(ref, torch.device(device))
        else:
            tensor = consumer.get(ref, copy=copy)
        with self._counts_lock:
            self._bytes_moved[consumer.kind, "read"] += ref.byte_size
        return tensor

    def check(self, ref: tensor_pb2.TensorRef, content_tag: bytes = b"") -> None:
        """That a shared-memory payload read earlier (``get``) is still held under ``ref``'s
        lease, tagged ``content_tag`` where given (``ShmConsumer.check``): for a reader that
        used a view (a copy was checked once copied); another location's payload cannot change
        under its reader, so there is nothing to check."""
        consumer = self.consumers.get(ref.WhichOneof("location") or "")
        if isinstance(consumer, ShmConsumer):
            consumer.check(ref, content_tag)

    def release(self, lease_ids: Iterable[str]) -> int:
        """Free the given leases (unknown ones are ignored); returns how many were held. A lease
        is held by one producer at most: the first that held it ends the search."""
        return sum(
            any(producer.release(lease_id) for producer in self.producers.values())
            for lease_id in lease_ids
        )

    def held(self) -> list[LeaseInfo]:
        """Every payload this process still holds."""
        return [info for producer in self.producers.values() for info in producer.held()]

    def reap_expired(self) -> int:
        """Free expired leases now; returns how many."""
        num_freed = 0
        for producer in self.producers.values():
            num_expired = producer.reap_expired()
            if num_expired:
                with self._counts_lock:
                    self._leases_expired[producer.kind] += num_expired
            num_freed += num_expired
        return num_freed

    def bytes_moved(self) -> dict[tuple[str, str], int]:
        """Bytes handed over so far by (kind, direction): "put" by this process as producer,
        "read" by it as consumer."""
        with self._counts_lock:
            return dict(self._bytes_moved)

    def leases_expired(self) -> dict[str, int]:
        """Leases the reaper freed so far because nobody released them (a leak), by kind."""
        with self._counts_lock:
            return dict(self._leases_expired)

    def num_shm_segments(self) -> int:
        """Shared-memory segments this plane's producer has now (leased or pooled)."""
        shm_producer = self.producers.get(tensor_pb2.TRANSFER_KIND_SHM)
        return shm_producer.num_segments if isinstance(shm_producer, ShmProducer) else 0

    def remove_orphans(self) -> list[str]:
        """Unlink shared-memory segments of dead producers on this host, and what dead engines
        left in /dev/shm (``shm_leftovers``); returns their names."""
        shm_producer = self.producers.get(tensor_pb2.TRANSFER_KIND_SHM)
        removed = shm_producer.remove_orphans() if isinstance(shm_producer, ShmProducer) else []
        return removed + cleanup_leftovers()

    def trim(self) -> None:
        """Let consumers drop cached state that no longer serves (shm: mappings of segments
        their producers unlinked, pages written to views that have died)."""
        for consumer in self.consumers.values():
            consumer.trim()

    def start_reaper(
        self, interval_s: float = 1.0, orphan_interval_s: float = ORPHAN_SWEEP_S
    ) -> None:
        """Reap expired leases (and trim consumers) every ``interval_s``, and remove dead
        producers' segments and dead engines' leftovers every ``orphan_interval_s``, in a daemon
        thread until ``close``."""
        if self._reaper is not None:
            return

        def loop() -> None:
            next_sweep = time.monotonic() + orphan_interval_s
            while not self._stop.wait(interval_s):
                if freed := self.reap_expired():
                    logger.warning("freed %d payloads whose lease expired unreleased", freed)
                self.trim()
                if time.monotonic() >= next_sweep:
                    next_sweep = time.monotonic() + orphan_interval_s
                    if removed := self.remove_orphans():
                        logger.info("removed shared memory of dead processes: %s", removed)

        self._reaper = threading.Thread(target=loop, name="epd-lease-reaper", daemon=True)
        self._reaper.start()

    def close(self) -> None:
        """Stop the reaper and free every payload."""
        self._stop.set()
        if self._reaper is not None:
            self._reaper.join()
        for producer in self.producers.values():
            producer.close()
        for consumer in self.consumers.values():
            consumer.close()
