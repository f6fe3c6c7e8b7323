"""The two sides of a tensor handoff.

A producer (the process that computed a tensor, e.g. an encoder) calls ``put`` once per tensor;
the payload is copied into memory the producer owns (the NIXL producer lends large tensors in
place instead: then the caller must not modify the tensor until its lease ends) and a
``TensorRef`` comes back to send over gRPC. A consumer (e.g. a prefill worker), in another
process or on another host, calls ``get`` with that reference. The producer keeps the payload
until ``release`` is called with the lease id (the holder of the reference decides when: after
the consumer is done) or until the lease expires and ``reap_expired`` frees it. Nothing is freed
by ``get``.

Who frees what:
- ``put`` -> the producer owns the payload until release or expiry.
- ``get(copy=False)`` -> a zero-copy view where the backend allows it, valid only until the lease
  is released (afterwards its memory may hold another tensor). ``get(copy=True)`` returns a
  private tensor the caller owns.
- ``release`` is idempotent: unknown or already released leases return False.

A ``LeasedProducer`` keeps that bookkeeping (who holds what until when) without I/O, on an
injectable clock; its subclasses say how a payload is freed.
"""

from __future__ import annotations

import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, NamedTuple, TypedDict, TypeVar

import torch

from epd.server.transfer.idle_pool import DEFAULT_MAX_IDLE_BYTES
from epd.v1 import tensor_pb2

if TYPE_CHECKING:
    from typing_extensions import Unpack


Payload = TypeVar("Payload")
Clock = Callable[[], float]
# seconds a producer keeps a payload its consumer has not released (a consumer that died)
DEFAULT_LEASE_TTL_S = 60.0


class LeaseInfo(NamedTuple):
    """One payload still held by a producer.

    NOTE: a NamedTuple, not a frozen dataclass: one is made per ``put``, and a frozen dataclass
    costs more to build (its ``__init__`` goes through ``object.__setattr__``)."""

    lease_id: str
    kind: str
    byte_size: int
    location: str
    expires_at: float


_IDS_PER_DRAW = 256
_ids: list[str] = []
# NOTE: a forked child must not hand out the ids its parent drew.
os.register_at_fork(after_in_child=_ids.clear)


def new_lease_id() -> str:
    """128 random bits as 32 hex digits (like ``uuid4().hex``, from ``os.urandom``), drawn
    ``_IDS_PER_DRAW`` at a time (one ``getrandom`` call per id is slow in a process just woken by
    a request). Thread-safe: ``list.pop`` and ``list.extend`` are atomic under the GIL."""
    while True:
        try:
            return _ids.pop()
        except IndexError:
            digits = os.urandom(16 * _IDS_PER_DRAW).hex()
            _ids.extend(digits[i : i + 32] for i in range(0, len(digits), 32))


class TensorProducer(ABC):
    """Producer side of one backend. Thread-safe."""

    kind: str

    @abstractmethod
    def put(self, tensor: torch.Tensor, *, ttl_s: float | None = None) -> tensor_pb2.TensorRef:
        """Copy (or lend, see the module docstring) ``tensor`` (host or device memory: a device
        tensor is copied to host memory once, straight into the payload, unless the backend
        lends it from device memory); return its reference."""

    def release(self, lease_id: str) -> bool:
        """Free the payload of ``lease_id``. Returns whether it was held. Idempotent."""
        return False

    def held(self) -> list[LeaseInfo]:
        """Payloads still held, oldest expiry first (for leak checks and debugging)."""
        return []

    def reap_expired(self) -> int:
        """Free payloads whose lease expired; returns how many."""
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free everything this producer holds. The producer is unusable afterwards."""


class ProducerSettings(TypedDict, total=False):
    """The keyword arguments of a ``LeasedProducer`` that its subclasses pass on as they are:
    ``producer_endpoint`` (default empty: not known yet), ``ttl_s`` (``DEFAULT_LEASE_TTL_S``),
    ``clock`` (``time.time``) and ``max_idle_bytes``, the idle budget of its pool of payload
    memory (``DEFAULT_MAX_IDLE_BYTES``)."""

    producer_endpoint: str
    ttl_s: float
    clock: Clock
    max_idle_bytes: int


class LeasedProducer(TensorProducer, Generic[Payload]):
    """A producer that holds each payload under a lease (shm, NIXL), in memory it pools: the
    lease table on ``clock``, the default lease ``ttl_s``, what its references tell holders
    (``host_id``, and ``producer_endpoint``, where to release) and its pool's idle budget
    ``max_idle_bytes``. Subclasses say how a payload is freed."""

    def __init__(self, host_id: str, **settings: Unpack[ProducerSettings]) -> None:
        self.host_id = host_id
        self.producer_endpoint = settings.get("producer_endpoint", "")
        self.ttl_s = settings.get("ttl_s", DEFAULT_LEASE_TTL_S)
        self.max_idle_bytes = settings.get("max_idle_bytes", DEFAULT_MAX_IDLE_BYTES)
        self._clock = settings.get("clock", time.time)
        self._leases: dict[str, tuple[LeaseInfo, Payload]] = {}
        self._leases_lock = threading.Lock()

    @abstractmethod
    def _free(self, payload: Payload) -> None:
        """Give ``payload``'s memory back (its lease is gone already)."""

    def _lease(
        self,
        ref: tensor_pb2.TensorRef,
        payload: Payload,
        location: str,
        ttl_s: float | None,
    ) -> LeaseInfo:
        """Hold ``payload`` (``ref``'s bytes, at ``location``) under a new lease of ``ttl_s``
        (None: the default) and fill in ``ref``'s holder-facing fields (host, lease, expiry,
        where to release)."""
        expires_at = self._clock() + (ttl_s or self.ttl_s)
        info = LeaseInfo(new_lease_id(), self.kind, ref.byte_size, location, expires_at)
        with self._leases_lock:
            self._leases[info.lease_id] = (info, payload)
        ref.host_id = self.host_id
        ref.lease_id = info.lease_id
        ref.lease_expire_time_ms = int(info.expires_at * 1000)
        ref.producer_endpoint = self.producer_endpoint
        return info

    def release(self, lease_id: str) -> bool:
        with self._leases_lock:
            lease = self._leases.pop(lease_id, None)
        if lease is None:
            return False
        self._free(lease[1])
        return True

    def held(self) -> list[LeaseInfo]:
        with self._leases_lock:
            infos = [info for info, _ in self._leases.values()]
        return sorted(infos, key=lambda info: info.expires_at)

    def reap_expired(self) -> int:
        now = self._clock()
        with self._leases_lock:
            expired = [key for key, (info, _) in self._leases.items() if info.expires_at <= now]
            payloads = [self._leases.pop(key)[1] for key in expired]
        for payload in payloads:
            self._free(payload)
        return len(payloads)

    def close(self) -> None:
        with self._leases_lock:
            payloads = [payload for _, payload in self._leases.values()]
            self._leases.clear()
        for payload in payloads:
            self._free(payload)


class TensorConsumer(ABC):
    """Consumer side of one backend. Thread-safe."""

    kind: str

    @abstractmethod
    def get(self, ref: tensor_pb2.TensorRef, *, copy: bool = False) -> torch.Tensor:
        """The tensor ``ref`` points to (see the module docstring for the view's lifetime)."""

    def get_on(self, ref: tensor_pb2.TensorRef, device: torch.device) -> torch.Tensor:
        """The tensor ``ref`` points to, as a tensor of its own on accelerator ``device``: by
        default one copy up from the host view (the view is dropped at once)."""
        return self.get(ref).to(device)

    def trim(self) -> None:  # noqa: B027 - optional hook
        """Drop cached state that no longer serves (called by the data plane's reaper)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Drop cached connections or mappings."""
