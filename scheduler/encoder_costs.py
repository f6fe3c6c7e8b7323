"""What each encoder's work costs and how long it stays busy, as the scheduler learns it: service
times per mean-sized item, the time each encoder is expected to be busy until, when each last
gave a fresh sample, and the demand on each kind of encoder (``demand``). No grpc, no I/O; the
scheduler's lock serialises every call.
"""

from __future__ import annotations

from collections.abc import Sequence

from epd.scheduler.demand import DemandTracker, EncoderDemand, KindState, device_kind
from epd.scheduler.model import EncodeItem, RegisteredWorker
from epd.scheduler.policies.encoders import AdaptivePolicy, EncoderView, Ewma
from epd.scheduler.registry import Clock


class ServiceTimes:
    """Per-item service time per worker id, in milliseconds.

    Two sources: what the worker measures itself (compute time per item, sent in heartbeats:
    exact, but only as fresh as the last heartbeat) and what the scheduler infers from completed
    assignments (always available, but it folds in queueing it can only estimate). The worker's
    own figure wins when there is one.
    """

    def __init__(self, alpha: float = 0.3) -> None:
        self._alpha = alpha
        self._reported: dict[str, Ewma] = {}
        self._by_worker: dict[str, Ewma] = {}

    def add_reported(self, worker_id: str, item_ms: float, units_per_item: float = 1.0) -> None:
        """Record the worker's own per-item compute time (from a heartbeat), its items having
        been ``units_per_item`` mean-sized items each of late."""
        self._reported.setdefault(worker_id, Ewma(self._alpha)).add(item_ms / units_per_item)

    def add_completion(
        self, worker_id: str, max_latency_ms: float, num_units: float, backlog_at_assign: int
    ) -> None:
        """A finished group of ``num_units`` of work (items scaled by their size, see
        ``AdaptivePolicy.units``) whose last item arrived ``max_latency_ms`` after the call; the
        encoder also had ``backlog_at_assign`` items ahead of it (serial service)."""
        if num_units > 0:
            item_ms = max_latency_ms / (num_units + backlog_at_assign)
            self._by_worker.setdefault(worker_id, Ewma(self._alpha)).add(item_ms)

    def estimates(self, worker_id: str) -> tuple[float | None, float | None, float | None]:
        """(the estimate, the worker's own figure, the inferred one), each None without
        samples: the estimate is the worker's own figure when it has one, else the inferred."""
        own, inferred = self._reported.get(worker_id), self._by_worker.get(worker_id)
        own_ms = own.value if own is not None else None
        inferred_ms = inferred.value if inferred is not None else None
        return (own_ms if own_ms is not None else inferred_ms), own_ms, inferred_ms

    def slowest(self, worker_id: str) -> float | None:
        """The larger of the two estimates (None without samples): the worker's own figure is
        its compute alone, the inferred one includes what surrounds it (loading, preparing,
        handing over), which bounds how fast the worker really serves."""
        known = [figure for figure in self.estimates(worker_id)[1:] if figure is not None]
        return max(known) if known else None

    def forget(self, worker_id: str) -> None:
        """Drop the estimates of a worker that left."""
        self._reported.pop(worker_id, None)
        self._by_worker.pop(worker_id, None)


class EncoderCosts:
    """Learned costs and expected backlogs of the encoders, by worker id."""

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
        self._service = ServiceTimes()
        self._busy_until: dict[str, float] = {}
        # NOTE: the mean size of the items each encoder was given of late turns the per-item
        # latency it reports into a per-unit one (an encoder fed big images is not slow).
        self._units_per_item: dict[str, Ewma] = {}
        # NOTE: when each encoder last finished computed work (its registration until then):
        # an idle encoder's estimate older than probe_after_s is stale and gets probed.
        self._sampled_at: dict[str, float] = {}
        self._batches_seen: dict[str, int] = {}

    def registered(self, worker_id: str) -> None:
        """A worker (re)registered: its estimate is fresh from now on."""
        self._sampled_at[worker_id] = self._clock()
        self._batches_seen.pop(worker_id, None)

    def reported(self, worker_id: str, item_latency_ms: float, batches_finished: int = 0) -> None:
        """An encoder's heartbeat reported its latest batch's latency per item, after
        ``batches_finished`` batches (0: not counted); a figure it already reported after as
        many batches is not a new sample (an idle encoder repeats its last batch's)."""
        if batches_finished:
            if self._batches_seen.get(worker_id) == batches_finished:
                return
            self._batches_seen[worker_id] = batches_finished
        units = self._units_per_item.get(worker_id, Ewma()).value or 1.0
        self._service.add_reported(worker_id, item_latency_ms, units)

    def service_ms(self, worker_id: str) -> float | None:
        """Learned service time of one mean-sized item on ``worker_id`` (None: not measured)."""
        return self._service.estimates(worker_id)[0]

    def view(self, worker: RegisteredWorker, cached: frozenset[str]) -> EncoderView:
        """The policy's view of ``worker``, which answers ``cached`` without its tower."""
        busy_ms = (self._busy_until.get(worker.id, 0.0) - self._clock()) * 1000
        service_ms, own_ms, inferred_ms = self._service.estimates(worker.id)
        return EncoderView(
            worker.id,
            worker.spec.device,
            worker.spec.weight,
            backlog_items=worker.num_assigned_in_flight,
            service_ms=service_ms,
            own_ms=own_ms,
            inferred_ms=inferred_ms,
            backlog_ms=max(0.0, busy_ms),
            cached=cached,
            is_stale=self.is_stale(worker.id),
        )

    def is_stale(self, worker_id: str) -> bool:
        """Whether ``worker_id``'s estimate had no fresh sample for the probe horizon."""
        now: float = self._clock()
        return now - self._sampled_at.get(worker_id, now) > self._probe_after_s

    def assigned(
        self,
        ids: Sequence[str],
        items: Sequence[EncodeItem],
        views: Sequence[EncoderView],
        workers: Sequence[RegisteredWorker],
    ) -> None:
        """Items were placed (``ids[i]`` encodes ``items[i]``, of ``workers``): push each
        encoder's busy-until time by its work (an item it answers without its tower adds almost
        none), learn the sizes it is given and count the arrivals on its kind."""
        adaptive = self._adaptive
        service_ms = adaptive.service_times(views)
        views_by_id = {view.id: view for view in views}
        specs = {worker.id: worker.spec for worker in workers}
        now = self._clock()
        for worker_id, item in zip(ids, items, strict=True):
            start = max(now, self._busy_until.get(worker_id, now))
            work_ms = service_ms[worker_id] * adaptive.cost(item, views_by_id[worker_id])
            self._busy_until[worker_id] = start + work_ms / 1000
            units = adaptive.units(item)
            self._units_per_item.setdefault(worker_id, Ewma()).add(units)
            self._demand.arrived(specs[worker_id].model, specs[worker_id].device, units, now)

    def finished(
        self,
        worker: RegisteredWorker,
        answered: Sequence[tuple[float, float, bool]],
        backlog_at_assign: int,
    ) -> None:
        """A group of items given to ``worker`` with ``backlog_at_assign`` items ahead closed;
        ``answered``: (units, latency ms, cache hit) of each item it answered. The computed ones
        are a service-time sample (the slowest over their units), all count for the demand, and
        an encoder with nothing assigned left is not busy past now."""
        now = self._clock()
        if worker.num_assigned_in_flight == 0:
            self._busy_until[worker.id] = min(self._busy_until.get(worker.id, 0.0), now)
        computed = [(units, latency_ms) for units, latency_ms, hit in answered if not hit]
        if computed:
            if self.is_stale(worker.id):
                self._service.forget(worker.id)  # NOTE: a fresh sample outweighs a stale one
            self._sampled_at[worker.id] = now
            latency_ms = max(latency for _, latency in computed)
            units = sum(units for units, _ in computed)
            self._service.add_completion(worker.id, latency_ms, units, backlog_at_assign)
        for units, _, hit in answered:
            self._demand.done(worker.spec.model, worker.spec.device, units, hit, now)

    def demand(self, encoders: Sequence[RegisteredWorker]) -> list[EncoderDemand]:
        """The encoders each (model, kind) needs, given the live ``encoders``."""
        now = self._clock()
        grouped: dict[tuple[str, str], list[RegisteredWorker]] = {}
        for worker in encoders:
            key = (worker.spec.model, device_kind(worker.spec.device))
            grouped.setdefault(key, []).append(worker)
        states = {}
        for key, workers in grouped.items():
            costs = [self._service.slowest(w.id) for w in workers]
            backlog = sum(max(0.0, self._busy_until.get(w.id, now) - now) for w in workers)
            states[key] = KindState(len(workers), tuple(c for c in costs if c), backlog)
        return self._demand.demand(states, now)

    def forget(self, worker_id: str) -> None:
        """Drop what was learned of a worker that left."""
        self._service.forget(worker_id)
        self._busy_until.pop(worker_id, None)
        self._units_per_item.pop(worker_id, None)
        self._sampled_at.pop(worker_id, None)
        self._batches_seen.pop(worker_id, None)
