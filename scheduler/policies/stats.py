"""Online per-encoder service-time estimates (EWMA), from heartbeats and completed work."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Ewma:
    """Exponentially weighted moving average; ``value`` is None until the first sample."""

    alpha: float = 0.3
    value: float | None = None
    num_samples: int = 0

    def add(self, sample: float) -> None:
        """Fold in one sample (non-positive samples are ignored)."""
        if sample <= 0:
            return
        self.value = (
            sample if self.value is None else (self.alpha * sample + (1 - self.alpha) * self.value)
        )
        self.num_samples += 1


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

    def add(self, worker_id: str, item_ms: float) -> None:
        """Record a per-item service time inferred from a completed assignment."""
        self._by_worker.setdefault(worker_id, Ewma(self._alpha)).add(item_ms)

    def add_completion(
        self, worker_id: str, max_latency_ms: float, num_units: float, backlog_at_assign: int
    ) -> None:
        """A finished group of ``num_units`` of work (items scaled by their size, see
        ``AdaptivePolicy.units``) whose last item arrived ``max_latency_ms`` after the call; the
        encoder also had ``backlog_at_assign`` items ahead of it (serial service)."""
        if num_units > 0:
            self.add(worker_id, max_latency_ms / (num_units + backlog_at_assign))

    def get(self, worker_id: str) -> float | None:
        """The estimate, or None without samples."""
        for source in (self._reported, self._by_worker):
            ewma = source.get(worker_id)
            if ewma is not None and ewma.value is not None:
                return ewma.value
        return None

    def own(self, worker_id: str) -> float | None:
        """The worker's own figure (from its heartbeats), or None before its first."""
        ewma = self._reported.get(worker_id)
        return ewma.value if ewma is not None else None

    def inferred(self, worker_id: str) -> float | None:
        """The figure inferred from completed assignments, or None before the first."""
        ewma = self._by_worker.get(worker_id)
        return ewma.value if ewma is not None else None

    def slowest(self, worker_id: str) -> float | None:
        """The larger of the two estimates (None without samples): the worker's own figure is
        its compute alone, the inferred one includes what surrounds it (loading, preparing,
        handing over), which bounds how fast the worker really serves."""
        sources = (self._reported.get(worker_id), self._by_worker.get(worker_id))
        known = [e.value for e in sources if e is not None and e.value is not None]
        return max(known) if known else None

    def forget(self, worker_id: str) -> None:
        """Drop the estimates of a worker that left."""
        self._reported.pop(worker_id, None)
        self._by_worker.pop(worker_id, None)
