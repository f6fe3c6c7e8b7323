"""The scheduler's logic, one object: registry, encoder assignment, prefill and decode choice.

The gRPC servicer and the simulator both drive this class; it has no grpc and no I/O. All public
methods are thread-safe (one lock: decisions are microseconds, far below RPC costs).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from epd.common.errors import InvalidArgument, Unavailable
from epd.common.flags import flag
from epd.common.roles import DEFAULT_PREFILL_ROLES, Role
from epd.scheduler.demand import DemandTracker, EncoderDemand, KindState, device_kind
from epd.scheduler.model import (
    Assignment,
    EncodeItem,
    ItemOutcome,
    Load,
    Policy,
    RegisteredWorker,
    WorkerSpec,
)
from epd.scheduler.policies.encoders import (
    AdaptivePolicy,
    EncoderPolicy,
    EncoderView,
    make_policy,
    parse_split_ratio,
)
from epd.scheduler.policies.routing import CACHE_AWARE, PREFILL_POLICIES, PrefillChooser
from epd.scheduler.policies.stats import Ewma, ServiceTimes
from epd.scheduler.registry import Clock, Registry

DEFAULT_POLICY = Policy.ADAPTIVE
# Reason of the Unavailable ``choose_decode`` raises when no decode worker is live.
NO_DECODE_WORKER = "NO_DECODE_WORKER"


def split_ratio(text: str) -> tuple[float, float]:
    """``--split-ratio``'s shares (``parse_split_ratio``); ValueError when malformed."""
    try:
        return parse_split_ratio(text)
    except InvalidArgument as e:
        raise ValueError(e.message) from None


@dataclass(slots=True)
class _Group:
    worker: RegisteredWorker
    item_indices: list[int]
    backlog_at_assign: int


@dataclass(slots=True)
class _Pending:
    groups: list[_Group]
    mm_hashes: list[str]
    units: list[float]
    created_at: float


@dataclass(slots=True)
class SchedulerConfig:
    """Deployment-level settings: the defaults of ``epd scheduler``'s flags (ValueError for a
    TTL or probe interval that is not positive)."""

    default_policy: Policy = field(
        default=DEFAULT_POLICY,
        metadata=flag(
            "encoder assignment policy when a request names none", env="EPD_SCHEDULER_POLICY"
        ),
    )
    split_ratio: tuple[float, float] | None = field(
        default=None,
        metadata=flag(
            "ACCELERATOR:CPU shares for per_request (and adaptive's prior), e.g. 8:1",
            env="EPD_SPLIT_RATIO",
            type=split_ratio,
            metavar="SPLIT_RATIO",
            default_help="default: the workers' weights",
        ),
    )
    ttl_s: float = field(
        default=10.0,
        metadata=flag(
            "a worker missing heartbeats this long is evicted", env="EPD_SCHEDULER_TTL_S"
        ),
    )
    assignment_timeout_s: float = 300.0
    max_remembered_hashes: int = 100_000
    probe_after_s: float = field(
        default=5.0,
        metadata=flag(
            "adaptive sends one item to an idle encoder whose service time has had no fresh "
            "sample this long",
            env="EPD_SCHEDULER_PROBE_AFTER_S",
        ),
    )

    encode_wait_target_s: float = field(
        default=0.25,
        metadata=flag(
            "the encode wait the autoscaling signal keeps under: epd_scheduler_encoders_needed "
            "counts the encoders of each kind the arrivals need for it (docs/metrics.md)",
            env="EPD_SCHEDULER_ENCODE_WAIT_TARGET_S",
        ),
    )
    demand_smoothing_s: float = field(
        default=30.0,
        metadata=flag(
            "time constant of the arrival rate behind epd_scheduler_encoders_needed "
            "(exponentially weighted)",
            env="EPD_SCHEDULER_DEMAND_SMOOTHING_S",
        ),
    )

    prefill_policy: str = field(
        default=CACHE_AWARE,
        metadata=flag(
            "how a prompt's prefill worker is chosen: cache_aware (the worker holding the "
            "longest prefix of the prompt's KV blocks, images included, unless it holds under "
            "half of them or is much busier than another) or round_robin (each worker in turn, "
            "the baseline)",
            env="EPD_PREFILL_POLICY",
            choices=PREFILL_POLICIES,
        ),
    )

    def __post_init__(self) -> None:
        if not (self.encode_wait_target_s > 0 and self.demand_smoothing_s > 0):
            raise ValueError("the encode wait target and the demand smoothing must be positive")
        if not self.ttl_s > 0:
            raise ValueError(f"ttl_s must be positive, got {self.ttl_s}")
        if not self.probe_after_s > 0:
            raise ValueError(f"probe_after_s must be positive, got {self.probe_after_s}")


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
        self._policies = {
            p: make_policy(p, None if p is Policy.PER_IMAGE else self.config.split_ratio)
            for p in Policy
        }
        self._service = ServiceTimes()
        # NOTE: in creation order (created_at never decreases): expiry reads it from the front.
        self._pending: dict[str, _Pending] = {}
        self._hash_homes: OrderedDict[str, set[str]] = OrderedDict()
        self._prefill = PrefillChooser(self.config.prefill_policy)
        self._prefixes = self._prefill.index
        self._busy_until: dict[str, float] = {}
        # NOTE: the mean size of the items each encoder was given of late turns the per-item
        # latency it reports into a per-unit one (an encoder fed big images is not slow).
        self._units_per_item: dict[str, Ewma] = {}
        # NOTE: when each encoder last finished computed work (its registration until then):
        # an idle encoder's estimate older than probe_after_s is stale and gets probed.
        self._sampled_at: dict[str, float] = {}
        # items placed so far, by (policy, encoder id)
        self.num_assigned: Counter[tuple[Policy, str]] = Counter()
        self._demand = DemandTracker(
            self.config.demand_smoothing_s, self.config.encode_wait_target_s
        )

    # ---- registry
    def register(self, spec: WorkerSpec) -> RegisteredWorker:
        """Register (or re-register) a worker."""
        with self._lock:
            worker = self.registry.register(spec)
            self._sampled_at[worker.id] = self._clock()
            return worker

    def heartbeat(
        self,
        lease_id: str,
        load: Load | None = None,
        stored_blocks: Sequence[int] = (),
        removed_blocks: Sequence[int] = (),
    ) -> RegisteredWorker:
        """Renew a lease, record load, cache contents and KV events."""
        with self._lock:
            worker = self.registry.heartbeat(lease_id, load)
            if load is not None and load.item_latency_ms > 0:
                units = self._units_per_item.get(worker.id, Ewma()).value or 1.0
                self._service.add_reported(worker.id, load.item_latency_ms, units)
            self._prefixes.store(worker.id, stored_blocks)
            self._prefixes.remove(worker.id, removed_blocks)
            return worker

    def deregister(self, lease_id: str) -> None:
        """End a worker's lease; it drains (listed, never chosen) while assigned work is in
        flight, then leaves with everything known about it."""
        with self._lock:
            self.registry.deregister(lease_id)

    def list_workers(self, role: Role | None = None, model: str = "") -> list[RegisteredWorker]:
        """Registered workers (draining ones included) of ``role`` and ``model`` (None / "" =
        any), by id."""
        with self._lock:
            return [
                w
                for w in self.registry.all()
                if (role is None or w.spec.role == role) and (not model or w.spec.model == model)
            ]

    # ---- encoders
    def assign_encoders(
        self,
        items: Sequence[EncodeItem],
        *,
        model: str = "",
        policy: Policy | None = None,
        exclude: Sequence[str] = (),
    ) -> Assignment:
        """Place each item on a live encoder of ``model``; Unavailable when there is none."""
        if not items:
            raise InvalidArgument("no items to assign", reason="NO_ITEMS")
        with self._lock:
            self._expire_assignments()
            workers = self.registry.live([Role.ENCODE], self._model(model), exclude)
            if not workers:
                raise Unavailable(
                    f"no live encoder for model {model or '(any)'}",
                    reason="NO_ENCODER",
                    metadata={"model": model},
                )
            chosen_policy = policy or self.config.default_policy
            hashes = frozenset(item.mm_hash for item in items if item.mm_hash)
            views = [self._view(w, hashes) for w in workers]
            self._adaptive.observe(items)
            ids = self._policies[chosen_policy].assign(items, views)
            self._advance_busy(ids, items, views)
            return self._record(ids, items, workers, chosen_policy)

    def complete_encoding(
        self, assignment_id: str, outcomes: Sequence[ItemOutcome], *, final: bool = True
    ) -> None:
        """Report outcomes of an assignment: each encoder's group whose items all have an
        outcome is closed (in-flight released, service time and cache homes learned). With
        ``final`` the whole assignment closes, groups without outcomes included; otherwise the
        rest stays open for later reports (the route reports each encoder as it finishes)."""
        with self._lock:
            pending = self._pending.get(assignment_id)
            if pending is None:
                return
            by_index = {outcome.item_index: outcome for outcome in outcomes}
            for group in list(pending.groups):
                if final or all(i in by_index for i in group.item_indices):
                    self._finish_group(group, by_index, pending)
                    pending.groups.remove(group)
            if final or not pending.groups:
                del self._pending[assignment_id]

    def service_ms(self, worker_id: str) -> float | None:
        """Learned service time of one mean-sized item on ``worker_id`` (None: not measured)."""
        with self._lock:
            estimate: float | None = self._service.get(worker_id)
            return estimate

    def encoder_views(self) -> list[EncoderView]:
        """What the adaptive policy knows of every registered encoder now (learned service
        time, backlog), by id; for metrics and inspection."""
        with self._lock:
            encoders = [w for w in self.registry.all() if w.spec.role is Role.ENCODE]
            return [self._view(worker) for worker in encoders]

    def encoder_demand(self, model: str = "") -> list[EncoderDemand]:
        """How many encoders of each kind (device type) the current arrivals need, per model
        (``model``: that one only; "" every model), with what it is computed from
        (``scheduler/demand.py``)."""
        with self._lock:
            now = self._clock()
            demands = self._demand.demand(self._kind_states(now), now)
            return [d for d in demands if not model or d.model == model]

    def policy(self, policy: Policy) -> EncoderPolicy:
        """The policy object used for ``policy`` (for inspection and tests)."""
        return self._policies[policy]

    # ---- prefill / decode
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
                roles or DEFAULT_PREFILL_ROLES, self._model(model), exclude
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
            workers = self.registry.live([Role.DECODE], self._model(model), exclude)
            if not workers:
                raise Unavailable(
                    f"no live decode worker for model {model or '(any)'}", reason=NO_DECODE_WORKER
                )
            return min(workers, key=self._load_key)

    # ---- internals
    def _model(self, model: str) -> str:
        """Empty model means the only one registered; InvalidArgument when there are several."""
        if model:
            return model
        models = self.registry.models()
        if len(models) > 1:
            raise InvalidArgument(
                f"name the model: several are served ({', '.join(models)})",
                reason="MODEL_REQUIRED",
                metadata={"models": ",".join(models)},
            )
        return models[0] if models else ""

    def _view(
        self, worker: RegisteredWorker, mm_hashes: frozenset[str] = frozenset()
    ) -> EncoderView:
        """The policy's view of ``worker``; ``cached`` lists which of ``mm_hashes`` it holds."""
        cached = {
            h
            for h in mm_hashes
            if h in worker.load.cached_mm_hashes or worker.id in self._hash_homes.get(h, ())
        }
        busy_ms = (self._busy_until.get(worker.id, 0.0) - self._clock()) * 1000
        return EncoderView(
            worker.id,
            worker.spec.device,
            worker.spec.weight,
            backlog_items=worker.num_assigned_in_flight,
            service_ms=self._service.get(worker.id),
            backlog_ms=max(0.0, busy_ms),
            cached=frozenset(cached),
            is_stale=self._is_stale(worker.id),
        )

    def _kind_states(self, now: float) -> dict[tuple[str, str], KindState]:
        """The live encoders of each (model, kind): count, learned costs, seconds of backlog."""
        grouped: dict[tuple[str, str], list[RegisteredWorker]] = {}
        for worker in self.registry.live([Role.ENCODE], "", ()):
            key = (worker.spec.model, device_kind(worker.spec.device))
            grouped.setdefault(key, []).append(worker)
        states = {}
        for key, workers in grouped.items():
            costs = [self._service.slowest(w.id) for w in workers]
            backlog = sum(max(0.0, self._busy_until.get(w.id, now) - now) for w in workers)
            states[key] = KindState(len(workers), tuple(c for c in costs if c), backlog)
        return states

    def _is_stale(self, worker_id: str) -> bool:
        now: float = self._clock()
        return now - self._sampled_at.get(worker_id, now) > self.config.probe_after_s

    @staticmethod
    def _load_key(worker: RegisteredWorker) -> tuple[float, float, str]:
        load = worker.load
        busy = worker.num_assigned_in_flight + load.queue_depth + load.num_in_flight
        return (busy / worker.spec.capacity, load.kv_usage, worker.id)

    def _advance_busy(
        self, ids: list[str], items: Sequence[EncodeItem], views: list[EncoderView]
    ) -> None:
        """Push each chosen encoder's expected busy-until time by the work just given to it."""
        adaptive = self._adaptive
        service_ms = adaptive.service_times(views)
        now = self._clock()
        for worker_id, item in zip(ids, items, strict=True):
            start = max(now, self._busy_until.get(worker_id, now))
            work_ms = service_ms[worker_id] * adaptive.units(item)
            self._busy_until[worker_id] = start + work_ms / 1000

    @property
    def _adaptive(self) -> AdaptivePolicy:
        adaptive = self._policies[Policy.ADAPTIVE]
        assert isinstance(adaptive, AdaptivePolicy)
        return adaptive

    def _record(
        self,
        ids: list[str],
        items: Sequence[EncodeItem],
        workers: list[RegisteredWorker],
        policy: Policy,
    ) -> Assignment:
        by_id = {w.id: w for w in workers}
        groups: dict[str, _Group] = {}
        for index, worker_id in enumerate(ids):
            worker = by_id[worker_id]
            if worker_id not in groups:
                groups[worker_id] = _Group(worker, [], worker.num_assigned_in_flight)
            groups[worker_id].item_indices.append(index)
            self._units_per_item.setdefault(worker_id, Ewma()).add(
                self._adaptive.units(items[index])
            )
        now = self._clock()
        for group in groups.values():
            spec = group.worker.spec
            group.worker.num_assigned_in_flight += len(group.item_indices)
            self.num_assigned[policy, spec.id] += len(group.item_indices)
            units = sum(self._adaptive.units(items[i]) for i in group.item_indices)
            self._demand.arrived(spec.model, spec.device, units, now)
        assignment_id = uuid.uuid4().hex
        self._pending[assignment_id] = _Pending(
            list(groups.values()),
            [item.mm_hash for item in items],
            [self._adaptive.units(item) for item in items],
            self._clock(),
        )
        return Assignment(
            assignment_id, policy, tuple(ids), tuple(by_id[i].spec.endpoint for i in ids)
        )

    def _finish_group(
        self, group: _Group, outcomes: dict[int, ItemOutcome], pending: _Pending
    ) -> None:
        # NOTE: the group holds the registry entry it was given to, so a worker that left and
        # registered again is not charged for its predecessor's work.
        worker = group.worker
        worker.num_assigned_in_flight = max(
            0, worker.num_assigned_in_flight - len(group.item_indices)
        )
        if self.registry.get(worker.id) is not worker:
            return
        if worker.num_assigned_in_flight == 0:
            self._busy_until[worker.id] = min(self._busy_until.get(worker.id, 0.0), self._clock())
        done = [outcomes[i] for i in group.item_indices if i in outcomes and not outcomes[i].failed]
        computed = [o for o in done if not o.cache_hit]
        if computed:
            if self._is_stale(worker.id):
                self._service.forget(worker.id)  # NOTE: a fresh sample outweighs a stale estimate
            self._sampled_at[worker.id] = self._clock()
            self._service.add_completion(
                worker.id,
                max(o.latency_ms for o in computed),
                sum(pending.units[o.item_index] for o in computed),
                group.backlog_at_assign,
            )
        now = self._clock()
        for outcome in done:
            units = pending.units[outcome.item_index]
            self._demand.done(worker.spec.model, worker.spec.device, units, outcome.cache_hit, now)
            if mm_hash := pending.mm_hashes[outcome.item_index]:
                self._remember_home(mm_hash, worker.id)
        self.registry.finish_drain(worker)

    def _forget(self, worker: RegisteredWorker) -> None:
        """Drop what is known about a worker that left (its caches left with it)."""
        self._service.forget(worker.id)
        self._prefixes.forget(worker.id)
        self._busy_until.pop(worker.id, None)
        self._units_per_item.pop(worker.id, None)
        self._sampled_at.pop(worker.id, None)
        for homes in self._hash_homes.values():
            homes.discard(worker.id)
        for key in [k for k in self.num_assigned if k[1] == worker.id]:
            del self.num_assigned[key]

    def _remember_home(self, mm_hash: str, worker_id: str) -> None:
        self._hash_homes.setdefault(mm_hash, set()).add(worker_id)
        self._hash_homes.move_to_end(mm_hash)
        while len(self._hash_homes) > self.config.max_remembered_hashes:
            self._hash_homes.popitem(last=False)

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
