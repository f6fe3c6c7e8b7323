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
        self.value = sample if self.value is None else (
            self.alpha * sample + (1 - self.alpha) * self.value)  # fmt: skip
        self.num_samples += 1


class ServiceTimes:
    """Per-item service time per worker id, in milliseconds."""

    def __init__(self, alpha: float = 0.3) -> None:
        self._alpha = alpha
        self._by_worker: dict[str, Ewma] = {}

    def add(self, worker_id: str, item_ms: float) -> None:
        """Record a per-item service time sample for ``worker_id``."""
        self._by_worker.setdefault(worker_id, Ewma(self._alpha)).add(item_ms)

    def add_completion(self, worker_id: str, max_latency_ms: float, num_items: int,
                       backlog_at_assign: int) -> None:  # fmt: skip
        """A finished group of ``num_items`` whose last item arrived ``max_latency_ms`` after the
        call; the encoder also had ``backlog_at_assign`` items ahead of it (serial service)."""
        if num_items > 0:
            self.add(worker_id, max_latency_ms / (num_items + backlog_at_assign))

    def get(self, worker_id: str) -> float | None:
        """The estimate, or None without samples."""
        ewma = self._by_worker.get(worker_id)
        return None if ewma is None else ewma.value

    def forget(self, worker_id: str) -> None:
        """Drop the estimate of a worker that left."""
        self._by_worker.pop(worker_id, None)
