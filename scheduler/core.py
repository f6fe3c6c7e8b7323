"""The scheduler's logic, one object: registry, encoder assignment, prefill and decode choice.

The gRPC servicer and the simulator both drive this class; it has no grpc and no I/O. All public
methods are thread-safe (one lock: decisions are microseconds, far below RPC costs). What is
held where lives in ``holdings``, what encoders cost in ``encoder_costs``.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from epd.common.errors import InvalidArgument, Unavailable
from epd.common.held_items import HeldReport
from epd.common.roles import DEFAULT_PREFILL_ROLES, Role, hands_off_kv
from epd.scheduler.config import SchedulerConfig
from epd.scheduler.demand import DemandTracker, EncoderDemand
from epd.scheduler.encoder_costs import EncoderCosts
from epd.scheduler.holdings import Holdings
from epd.scheduler.model import (
    Assignment,
    EncodeItem,
    ItemOutcome,
    Load,
    Placement,
    Policy,
    RegisteredWorker,
    WorkerSpec,
)
from epd.scheduler.policies.encoders import (
    AdaptivePolicy,
    EncoderPolicy,
    EncoderView,
    PerImagePolicy,
    PerRequestPolicy,
)
from epd.scheduler.policies.routing import PrefillChooser
from epd.scheduler.registry import Clock, Registry


@dataclass(frozen=True, slots=True)
class _Item:
    index: int  # in the request
    mm_hash: str
    units: float
    is_encoding: bool  # its encoder was given it to encode (not held there nor in the store)


@dataclass(slots=True)
class _Group:
    """The items of one assignment given to one encoder."""

    worker: RegisteredWorker
    items: list[_Item]
    backlog_at_assign: int


@dataclass(slots=True)
class _Pending:
    groups: list[_Group]
    created_at: float


class Scheduler:
    """Registry plus every placement decision."""

    def __init__(
        self, config: SchedulerConfig | None = None, clock: Clock = time.monotonic
    ) -> None:
        self.config = config or SchedulerConfig()
        self._lock = threading.RLock()
        self.registry = Registry(self.config.ttl_s, clock, on_remove=self._forget, lock=self._lock)
        self._clock = clock
        # NOTE: per_image follows the workers' own weights (Dynamo's default); the split ratio
        # is per_request's knob and adaptive's prior before it has measured anything.
        self._adaptive = AdaptivePolicy(self.config.split_ratio)
        self._policies: dict[Policy, EncoderPolicy] = {
            Policy.PER_IMAGE: PerImagePolicy(),
            Policy.PER_REQUEST: PerRequestPolicy(self.config.split_ratio),
            Policy.ADAPTIVE: self._adaptive,
        }
        # NOTE: in creation order (created_at never decreases): expiry reads it from the front.
        self._pending: dict[str, _Pending] = {}
        self._holdings = Holdings(self.config.max_held_items)
        self._prefill = PrefillChooser(self.config.prefill_policy)
        self._prefixes = self._prefill.index
        self._costs = EncoderCosts(
            self._adaptive,
            clock,
            probe_after_s=self.config.probe_after_s,
            demand=DemandTracker(self.config.demand_smoothing_s, self.config.encode_wait_target_s),
        )
        # items placed so far, by (policy, encoder id)
        self.num_assigned: Counter[tuple[Policy, str]] = Counter()

    # ---- registry
    def register(self, spec: WorkerSpec) -> RegisteredWorker:
        """Register (or re-register) a worker."""
        with self._lock:
            worker = self.registry.register(spec)
            self._costs.registered(worker)
            return worker

    def heartbeat(
        self,
        lease_id: str,
        load: Load | None = None,
        stored_blocks: Sequence[int] = (),
        removed_blocks: Sequence[int] = (),
        held: HeldReport | None = None,
    ) -> RegisteredWorker:
        """Renew a lease, record load, KV events and what an encoder's cache took and evicted
        (``held``)."""
        with self._lock:
            worker = self.registry.heartbeat(lease_id, load)
            if held is not None:
                self._holdings.apply(worker.id, held)
            if load is not None and load.item_latency_ms > 0:
                self._costs.reported(worker.id, load.item_latency_ms, load.batches_finished)
            self._prefixes.store(worker.id, stored_blocks)
            self._prefixes.remove(worker.id, removed_blocks)
            return worker

    def deregister(self, lease_id: str) -> None:
        """End a worker's lease; it drains (listed, never chosen) while assigned work is in
        flight, then leaves with everything known about it."""
        with self._lock:
            self.registry.deregister(lease_id)

    # ---- encoders
    def assign_encoders(
        self,
        items: Sequence[EncodeItem],
        *,
        model: str = "",
        policy: Policy | None = None,
        exclude: Sequence[str] = (),
    ) -> Assignment:
        """Place each item on a live encoder of ``model``; Unavailable when there is none.

        An item being encoded goes to the encoder encoding it (one encoding answers every
        request for it: single flight), an item an encoder's cache holds to that encoder,
        whatever the policy; ``policy`` places the rest, an item the store holds costing it
        almost nothing anywhere."""
        if not items:
            raise InvalidArgument("no items to assign", reason="NO_ITEMS")
        with self._lock:
            self._expire_assignments()
            workers = self.registry.live(
                [Role.ENCODE], self.registry.requested_model(model), exclude
            )
            if not workers:
                raise Unavailable(
                    f"no live encoder for model {model or '(any)'}",
                    reason="NO_ENCODER",
                    metadata={"model": model},
                )
            chosen_policy = policy or self.config.default_policy
            hashes = frozenset(item.mm_hash for item in items if item.mm_hash)
            # NOTE: an encoder's cached items: those it answers without its tower (held in its
            # cache or the store, or being encoded there)
            can_serve = self._holdings.can_serve
            views = [
                self._costs.view(w, frozenset(h for h in hashes if can_serve(w.id, h)))
                for w in workers
            ]
            self._adaptive.observe(items)
            units = [self._adaptive.units(item) for item in items]
            ids = self._choose_encoders(items, workers, views, self._policies[chosen_policy])
            self._costs.assigned(ids, items, units, views)
            return self._record(ids, items, units, workers, chosen_policy)

    def complete_encoding(
        self, assignment_id: str, outcomes: Sequence[ItemOutcome], *, final: bool = True
    ) -> None:
        """Report outcomes of an assignment: each encoder's group whose items all have an
        outcome is closed (in-flight released, service time and held items learned). With
        ``final`` the whole assignment closes, groups without outcomes included; otherwise the
        rest stays open for later reports (the route reports each encoder as it finishes)."""
        with self._lock:
            pending = self._pending.get(assignment_id)
            if pending is None:
                return
            by_index = {outcome.item_index: outcome for outcome in outcomes}
            for group in list(pending.groups):
                if final or all(item.index in by_index for item in group.items):
                    self._finish_group(group, by_index)
                    pending.groups.remove(group)
            if final or not pending.groups:
                del self._pending[assignment_id]

    def service_ms(self, worker_id: str) -> float | None:
        """Learned service time of one mean-sized item on ``worker_id`` (None: not measured)."""
        with self._lock:
            return self._costs.service_ms(worker_id)

    def encoder_views(self) -> list[EncoderView]:
        """What the adaptive policy knows of every registered encoder now (learned service
        time, backlog), by id; for metrics and inspection."""
        with self._lock:
            encoders = self.registry.all(Role.ENCODE)
            return [self._costs.view(worker, frozenset()) for worker in encoders]

    def encoder_demand(self, model: str = "") -> list[EncoderDemand]:
        """How many encoders of each kind (device type) the current arrivals need, per model
        (``model``: that one only; "" every model), with what it is computed from
        (``scheduler/demand.py``)."""
        with self._lock:
            demands = self._costs.demand(self.registry.live([Role.ENCODE], "", ()))
            return [d for d in demands if not model or d.model == model]

    def held_items(self, worker_id: str, limit: int | None = None) -> list[str]:
        """The items the scheduler believes ``worker_id``'s cache holds (``limit``: at most that
        many), sorted."""
        with self._lock:
            return self._holdings.held_by(worker_id, limit)

    def held_counts(self) -> tuple[dict[str, int], int]:
        """How many items each holder (encoder id; "" the store) is believed to hold, and how
        many items are being encoded now (for metrics)."""
        with self._lock:
            return self._holdings.num_held(), self._holdings.num_encoding

    # ---- prefill / decode
    def place(
        self,
        items: Sequence[EncodeItem] = (),
        block_hashes: Sequence[int] = (),
        *,
        model: str = "",
        policy: Policy | None = None,
        prefill_roles: Sequence[Role] = DEFAULT_PREFILL_ROLES,
    ) -> Placement:
        """Where one request runs, in one decision: its prefill worker (``choose_prefill``), the
        decode worker that one hands its KV to (``hands_off_kv``: a prefill worker always, an
        encode_prefill worker while a decode worker is live) and, with ``items``, its encoders
        (``assign_encoders``). Unavailable with the first missing role's reason."""
        with self._lock:
            prefill, num_cached = self.choose_prefill(
                block_hashes, model=model, roles=prefill_roles
            )
            decoders = self.registry.live([Role.DECODE], self.registry.requested_model(model), ())
            decode = None
            if hands_off_kv(prefill.spec.role, is_decode_live=bool(decoders)):
                decode = self.choose_decode(model=model)
            encoders = self.assign_encoders(items, model=model, policy=policy) if items else None
            return Placement(prefill, num_cached, decode, encoders)

    def choose_prefill(
        self,
        block_hashes: Sequence[int] = (),
        *,
        model: str = "",
        exclude: Sequence[str] = (),
        roles: Sequence[Role] = DEFAULT_PREFILL_ROLES,
    ) -> tuple[RegisteredWorker, int]:
        """The worker the prefill policy chooses (``routing.PrefillChooser``: by default the
        one holding the longest prefix, balanced against load); records the prompt's blocks
        there. Returns (worker, number of cached leading blocks)."""
        with self._lock:
            workers = self.registry.live(
                roles or DEFAULT_PREFILL_ROLES, self.registry.requested_model(model), exclude
            )
            if not workers:
                raise Unavailable(
                    f"no live prefill worker for model {model or '(any)'}",
                    reason="NO_PREFILL_WORKER",
                )
            return self._prefill.choose(workers, block_hashes, lambda w: self._load_key(w)[0])

    def choose_decode(self, *, model: str = "", exclude: Sequence[str] = ()) -> RegisteredWorker:
        """The least-loaded live decode worker."""
        with self._lock:
            workers = self.registry.live(
                [Role.DECODE], self.registry.requested_model(model), exclude
            )
            if not workers:
                raise Unavailable(
                    f"no live decode worker for model {model or '(any)'}", reason="NO_DECODE_WORKER"
                )
            return min(workers, key=self._load_key)

    # ---- internals
    @staticmethod
    def _load_key(worker: RegisteredWorker) -> tuple[float, float, str]:
        load = worker.load
        busy = worker.num_assigned_in_flight + load.queue_depth + load.num_in_flight
        return (busy / worker.spec.capacity, load.kv_usage, worker.id)

    def _choose_encoders(
        self,
        items: Sequence[EncodeItem],
        workers: list[RegisteredWorker],
        views: list[EncoderView],
        policy: EncoderPolicy,
    ) -> list[str]:
        """One encoder id per item: where it is encoded or held (the least busy such encoder),
        else where ``policy`` puts it; a request's repeats of an item go with its first."""
        by_backlog = sorted(workers, key=lambda w: (w.num_assigned_in_flight, w.id))
        placed = self._holdings.place(items, [w.id for w in by_backlog])
        free = [i for i, worker_id in enumerate(placed) if worker_id is None]
        if free:
            chosen = policy.assign([items[i] for i in free], views)
            for index, worker_id in zip(free, chosen, strict=True):
                placed[index] = worker_id
        first: dict[str, str] = {}
        ids = []
        for item, placed_id in zip(items, placed, strict=True):
            assert placed_id is not None
            ids.append(first.setdefault(item.mm_hash, placed_id) if item.mm_hash else placed_id)
        return ids

    def _record(
        self,
        ids: list[str],
        items: Sequence[EncodeItem],
        units: list[float],
        workers: list[RegisteredWorker],
        policy: Policy,
    ) -> Assignment:
        """Open the assignment of ``items`` (of ``units`` sizes) to ``ids``: each encoder's group
        counted in flight, each item an encoder must encode marked as being encoded there."""
        by_id = {w.id: w for w in workers}
        groups: dict[str, _Group] = {}
        for index, (item, worker_id) in enumerate(zip(items, ids, strict=True)):
            worker = by_id[worker_id]
            if worker_id not in groups:
                groups[worker_id] = _Group(worker, [], worker.num_assigned_in_flight)
            encodes = bool(item.mm_hash) and not self._holdings.can_serve(worker_id, item.mm_hash)
            groups[worker_id].items.append(_Item(index, item.mm_hash, units[index], encodes))
        for group in groups.values():
            group.worker.num_assigned_in_flight += len(group.items)
            self.num_assigned[policy, group.worker.id] += len(group.items)
            for opened in group.items:
                if opened.is_encoding:
                    self._holdings.start_encoding(opened.mm_hash, group.worker.id)
        assignment_id = uuid.uuid4().hex
        self._pending[assignment_id] = _Pending(list(groups.values()), self._clock())
        return Assignment(
            assignment_id, policy, tuple(ids), tuple(by_id[i].spec.endpoint for i in ids)
        )

    def _finish_group(self, group: _Group, outcomes: dict[int, ItemOutcome]) -> None:
        # NOTE: the group holds the registry entry it was given to, so a worker that left and
        # registered again is not charged for its predecessor's work.
        worker = group.worker
        worker.num_assigned_in_flight = max(0, worker.num_assigned_in_flight - len(group.items))
        if worker.has_left:
            return
        answered = {index: outcome for index, outcome in outcomes.items() if not outcome.failed}
        samples = []
        for item in group.items:
            outcome = answered.get(item.index)
            if outcome is not None:
                samples.append((item.units, outcome.latency_ms, outcome.cache_hit))
            if item.mm_hash:
                self._holdings.close(
                    item.mm_hash,
                    worker.id,
                    was_encoding=item.is_encoding,
                    answered=outcome is not None,
                    computed=outcome is not None and not outcome.cache_hit,
                )
        self._costs.finished(worker, samples, group.backlog_at_assign)
        self.registry.finish_drain(worker)

    def _forget(self, worker: RegisteredWorker) -> None:
        """Drop what is known about a worker that left (its caches left with it)."""
        self._costs.forget(worker.id)
        self._prefixes.forget(worker.id)
        self._holdings.forget(worker.id)
        for key in [k for k in self.num_assigned if k[1] == worker.id]:
            del self.num_assigned[key]

    def _expire_assignments(self) -> None:
        """Give up the assignments older than the timeout: the oldest first, in ``_pending``'s
        order, stopping at the first younger one (not a scan of every pending assignment at
        every call)."""
        limit = self._clock() - self.config.assignment_timeout_s
        expired = []
        for assignment_id, pending in self._pending.items():
            if pending.created_at >= limit:
                break
            expired.append(assignment_id)
        for assignment_id in expired:
            self.complete_encoding(assignment_id, [], final=True)
