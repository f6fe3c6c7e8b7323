"""What each encoder's work costs and how long it stays busy, as the scheduler learns it: one
record per registered encoder (its service times per mean-sized item, the time it is expected to
be busy until, when it last gave a fresh sample, its kind's demand counters), made when it
registers and dropped when it leaves, and the demand on each kind of encoder (``demand``). No
grpc, no I/O; the scheduler's lock serialises every call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from epd.common.roles import Role
from epd.scheduler.demand import DemandTracker, EncoderDemand, KindArrivals, KindState, device_kind
from epd.scheduler.model import EncodeItem, RegisteredWorker
from epd.scheduler.policies.encoders import AdaptivePolicy, EncoderView, Ewma
from epd.scheduler.registry import Clock


@dataclass(slots=True)
class _Encoder:
    """What is learned of one registered encoder.

    Its service time per mean-sized item has two sources: what the encoder measures itself
    (``own``: compute time per item, sent in heartbeats, exact but only as fresh as the last
    heartbeat) and what the scheduler infers from completed assignments (``inferred``: always
    available, but it folds in queueing it can only estimate). The encoder's own figure wins
    when there is one.
    """

    kind: tuple[str, str]  # (model, device_kind): whose demand its arrivals count for
    arrivals: KindArrivals
    sampled_at: float  # NOTE: when it last finished computed work (its registration until then)
    own: Ewma = field(default_factory=Ewma)
    inferred: Ewma = field(default_factory=Ewma)
    busy_until: float = 0.0
    # NOTE: the mean size of the items it was given of late turns the per-item latency it
    # reports into a per-unit one (an encoder fed big images is not slow).
    units_per_item: Ewma = field(default_factory=Ewma)
    batches_seen: int = 0

    @property
    def service_ms(self) -> float | None:
        """The estimate: its own figure when it has one, else the inferred (None: neither)."""
        return self.own.value if self.own.value is not None else self.inferred.value

    def slowest_ms(self) -> float | None:
        """The larger of the two figures (None without samples): the own figure is its compute
        alone, the inferred one includes what surrounds it (loading, preparing, handing over),
        which bounds how fast it really serves."""
        known = [ms for ms in (self.own.value, self.inferred.value) if ms is not None]
        return max(known) if known else None


class EncoderCosts:
    """Learned costs and expected backlogs of the registered encoders, by worker id."""

    def __init__(
        self,
        adaptive: AdaptivePolicy,
        clock: Clock,
        *,
        probe_after_s: float,
        demand: DemandTracker,
    ) -> None:
        """``adaptive`` sizes items (``units``) and costs them on an encoder (``cost``)."""
        self._adaptive = adaptive
        self._clock = clock
        self._probe_after_s = probe_after_s
        self._demand = demand
        self._encoders: dict[str, _Encoder] = {}

    def registered(self, worker: RegisteredWorker) -> None:
        """A worker (re)registered: an encoder's estimates start afresh from now on."""
        if worker.spec.role is Role.ENCODE:
            kind = (worker.spec.model, device_kind(worker.spec.device))
            self._encoders[worker.id] = _Encoder(kind, self._demand.arrivals(kind), self._clock())

    def reported(self, worker_id: str, item_latency_ms: float, batches_finished: int = 0) -> None:
        """An encoder's heartbeat reported its latest batch's latency per item, after
        ``batches_finished`` batches (0: not counted); a figure it already reported after as
        many batches is not a new sample (an idle encoder repeats its last batch's)."""
        encoder = self._encoders.get(worker_id)
        if encoder is None or (batches_finished and encoder.batches_seen == batches_finished):
            return
        encoder.batches_seen = batches_finished or encoder.batches_seen
        encoder.own.add(item_latency_ms / (encoder.units_per_item.value or 1.0))

    def service_ms(self, worker_id: str) -> float | None:
        """Learned service time of one mean-sized item on ``worker_id`` (None: not measured)."""
        encoder = self._encoders.get(worker_id)
        return encoder.service_ms if encoder is not None else None

    def view(self, worker: RegisteredWorker, cached: frozenset[str]) -> EncoderView:
        """The policy's view of ``worker``, which answers ``cached`` without its tower."""
        encoder = self._encoders[worker.id]
        now = self._clock()
        return EncoderView(
            worker.id,
            worker.spec.device,
            worker.spec.weight,
            backlog_items=worker.num_assigned_in_flight,
            service_ms=encoder.service_ms,
            own_ms=encoder.own.value,
            inferred_ms=encoder.inferred.value,
            backlog_ms=max(0.0, (encoder.busy_until - now) * 1000),
            cached=cached,
            is_stale=self._is_stale(encoder, now),
        )

    def assigned(
        self,
        ids: Sequence[str],
        items: Sequence[EncodeItem],
        units: Sequence[float],
        views: Sequence[EncoderView],
    ) -> None:
        """Items were placed (``ids[i]`` encodes ``items[i]``, of ``units[i]`` mean-sized items):
        push each encoder's busy-until time by its work (an item it answers without its tower
        adds almost none), learn the sizes it is given and count the arrivals on its kind."""
        adaptive = self._adaptive
        service_ms = adaptive.service_times(views)
        views_by_id = {view.id: view for view in views}
        now = self._clock()
        for worker_id, item, size in zip(ids, items, units, strict=True):
            encoder = self._encoders[worker_id]
            work_ms = service_ms[worker_id] * adaptive.cost(item, views_by_id[worker_id])
            encoder.busy_until = max(now, encoder.busy_until) + work_ms / 1000
            encoder.units_per_item.add(size)
            encoder.arrivals.arrived(size, now)

    def finished(
        self,
        worker: RegisteredWorker,
        answered: Sequence[tuple[float, float, bool]],
        backlog_at_assign: int,
    ) -> None:
        """A group of items given to ``worker`` with ``backlog_at_assign`` items ahead closed;
        ``answered``: (units, latency ms, cache hit) of each item it answered. The computed ones
        are a service-time sample (the slowest over their units, the encoder serving its
        backlog first), all count for the demand, and an encoder with nothing assigned left is
        not busy past now."""
        encoder, now = self._encoders[worker.id], self._clock()
        if worker.num_assigned_in_flight == 0:
            encoder.busy_until = min(encoder.busy_until, now)
        computed = [(units, latency_ms) for units, latency_ms, hit in answered if not hit]
        if computed:
            if self._is_stale(encoder, now):
                encoder.own, encoder.inferred = Ewma(), Ewma()  # NOTE: fresh outweighs stale
            encoder.sampled_at = now
            latency_ms = max(latency for _, latency in computed)
            units = sum(units for units, _ in computed)
            if units > 0:
                encoder.inferred.add(latency_ms / (units + backlog_at_assign))
        for units, _, hit in answered:
            encoder.arrivals.done(units, hit, now)

    def demand(self, encoders: Sequence[RegisteredWorker]) -> list[EncoderDemand]:
        """The encoders each (model, kind) needs, given the live ``encoders``."""
        now = self._clock()
        grouped: dict[tuple[str, str], list[_Encoder]] = {}
        for worker in encoders:
            encoder = self._encoders[worker.id]
            grouped.setdefault(encoder.kind, []).append(encoder)
        states = {}
        for kind, members in grouped.items():
            costs = [encoder.slowest_ms() for encoder in members]
            backlog = sum(max(0.0, encoder.busy_until - now) for encoder in members)
            states[kind] = KindState(len(members), tuple(c for c in costs if c), backlog)
        return self._demand.demand(states, now)

    def forget(self, worker_id: str) -> None:
        """Drop what was learned of a worker that left."""
        self._encoders.pop(worker_id, None)

    def _is_stale(self, encoder: _Encoder, now: float) -> bool:
        """Whether ``encoder``'s estimate had no fresh sample for the probe horizon."""
        return now - encoder.sampled_at > self._probe_after_s
