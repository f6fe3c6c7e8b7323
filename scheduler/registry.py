"""Live workers with leases: registration, heartbeats, eviction (injectable clock)."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable

from epd.common.errors import AlreadyExists, InvalidArgument, NotFound
from epd.common.roles import Role
from epd.scheduler.model import Load, RegisteredWorker, WorkerSpec

Clock = Callable[[], float]
OnRemove = Callable[[RegisteredWorker], None]


def validate_endpoint(endpoint: str) -> None:
    """Raise InvalidArgument unless ``endpoint`` is host:port with a port in 1..65535."""
    host, sep, port = endpoint.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or " " in host:
        raise InvalidArgument(f"endpoint {endpoint!r} is not host:port", reason="BAD_ENDPOINT")


def validate_spec(spec: WorkerSpec) -> None:
    """Raise InvalidArgument naming the first bad field of a registration."""
    if not spec.id.strip():
        raise InvalidArgument("worker id must not be empty", reason="BAD_WORKER_ID")
    if not spec.model.strip():
        raise InvalidArgument("worker model must not be empty", reason="BAD_MODEL")
    validate_endpoint(spec.endpoint)
    if not spec.weight > 0:
        raise InvalidArgument(f"weight must be > 0, got {spec.weight}", reason="BAD_WEIGHT")
    if spec.capacity < 1:
        raise InvalidArgument(f"capacity must be >= 1, got {spec.capacity}", reason="BAD_CAPACITY")


class Registry:
    """Thread-safe registry. A worker is live while heartbeats arrive within ``ttl_s``.

    ``on_remove(worker)`` runs (under the lock) whenever an entry leaves for good: evicted,
    deregistered and drained, or replaced by a new registration of its id (a restarted worker
    has lost its caches). ``lock`` lets an owner share one lock with the registry, so callbacks
    never take a second lock in the other order.
    """

    def __init__(
        self,
        ttl_s: float = 10.0,
        clock: Clock = time.monotonic,
        *,
        on_remove: OnRemove | None = None,
        lock: threading.RLock | None = None,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self.ttl_s = ttl_s
        self._clock = clock
        self._on_remove = on_remove or (lambda worker: None)
        self._by_id: dict[str, RegisteredWorker] = {}
        self._by_lease: dict[str, str] = {}
        self._lock = lock or threading.RLock()
        self.num_registered: Counter[Role] = Counter()  # registrations accepted, by role
        self.num_evicted = 0  # workers removed for missing heartbeats

    def register(self, spec: WorkerSpec) -> RegisteredWorker:
        """Add ``spec`` (or replace its earlier entry: same endpoint, or an expired one)."""
        validate_spec(spec)
        with self._lock:
            self.evict_expired()
            old = self._by_id.get(spec.id)
            if old is not None and old.spec.endpoint != spec.endpoint and not old.draining:
                raise AlreadyExists(
                    f"worker id {spec.id!r} is held by a live worker at {old.spec.endpoint}",
                    reason="DUPLICATE_WORKER_ID",
                    metadata={"endpoint": old.spec.endpoint},
                )
            if old is not None:
                self._remove(old)
            worker = RegisteredWorker(spec, uuid.uuid4().hex, self._clock())
            self._by_id[spec.id] = worker
            self._by_lease[worker.lease_id] = spec.id
            self.num_registered[spec.role] += 1
            return worker

    def heartbeat(self, lease_id: str, load: Load | None = None) -> RegisteredWorker:
        """Renew ``lease_id``; NotFound when unknown or expired (the worker must re-register)."""
        with self._lock:
            self.evict_expired()
            worker = self._worker_of(lease_id)
            worker.last_heartbeat = self._clock()
            if load is not None:
                worker.load = load
            return worker

    def deregister(self, lease_id: str) -> RegisteredWorker | None:
        """End the lease of ``lease_id`` (unknown leases are ignored). A worker with assigned
        work in flight stays listed as draining (never chosen) until ``finish_drain`` or its TTL;
        others leave at once."""
        with self._lock:
            worker_id = self._by_lease.pop(lease_id, None)
            worker = None if worker_id is None else self._by_id.get(worker_id)
            if worker is not None:
                worker.draining = True
                self.finish_drain(worker)
            return worker

    def finish_drain(self, worker: RegisteredWorker) -> None:
        """Remove ``worker`` if it is draining and has nothing assigned in flight."""
        with self._lock:
            if worker.draining and worker.num_assigned_in_flight == 0 and not worker.has_left:
                self._remove(worker)

    def evict_expired(self) -> list[RegisteredWorker]:
        """Remove workers whose last heartbeat is older than the TTL; returns them."""
        deadline = self._clock() - self.ttl_s
        with self._lock:
            expired = [w for w in self._by_id.values() if w.last_heartbeat < deadline]
            for worker in expired:
                self._remove(worker)
            self.num_evicted += len(expired)
            return expired

    def live(
        self, roles: Iterable[Role], model: str = "", exclude: Iterable[str] = ()
    ) -> list[RegisteredWorker]:
        """Live workers of ``roles`` serving ``model`` ("" = any), by id, minus ``exclude``."""
        wanted, excluded = set(roles), set(exclude)
        with self._lock:
            self.evict_expired()
            return sorted(
                (
                    w
                    for w in self._by_id.values()
                    if w.spec.role in wanted
                    and w.id not in excluded
                    and not w.draining
                    and (not model or w.spec.model == model)
                ),
                key=lambda w: w.id,
            )

    def all(self, role: Role | None = None, model: str = "") -> list[RegisteredWorker]:
        """Registered workers (draining ones included) of ``role`` and ``model`` (None / "" =
        any), by id."""
        with self._lock:
            self.evict_expired()
            workers = sorted(self._by_id.values(), key=lambda w: w.id)
        return [
            w
            for w in workers
            if (role is None or w.spec.role is role) and (not model or w.spec.model == model)
        ]

    def get(self, worker_id: str) -> RegisteredWorker | None:
        """The worker with ``worker_id``, if registered."""
        with self._lock:
            return self._by_id.get(worker_id)

    def models(self) -> list[str]:
        """Models served by at least one registered worker."""
        with self._lock:
            return sorted({w.spec.model for w in self._by_id.values()})

    def requested_model(self, name: str) -> str:
        """``name``, or when empty the only model registered ("" when none is); InvalidArgument
        (MODEL_REQUIRED) when several are."""
        if name:
            return name
        models = self.models()
        if len(models) > 1:
            raise InvalidArgument(
                f"name the model: several are served ({', '.join(models)})",
                reason="MODEL_REQUIRED",
                metadata={"models": ",".join(models)},
            )
        return models[0] if models else ""

    def heartbeat_age(self, worker: RegisteredWorker) -> float:
        """Seconds since ``worker``'s latest heartbeat."""
        return self._clock() - worker.last_heartbeat

    def _remove(self, worker: RegisteredWorker) -> None:
        worker.has_left = True
        del self._by_id[worker.id]
        self._by_lease.pop(worker.lease_id, None)
        self._on_remove(worker)

    def _worker_of(self, lease_id: str) -> RegisteredWorker:
        worker_id = self._by_lease.get(lease_id)
        if worker_id is None:
            raise NotFound("unknown or expired lease; register again", reason="LEASE_NOT_FOUND")
        return self._by_id[worker_id]
