"""Smooth weighted round robin (the nginx algorithm): over any window the picks follow the
weights as evenly interleaved as possible (5:1:1 gives a a b a c a a, not a a a a a b c)."""

from __future__ import annotations

from collections.abc import Sequence


class SmoothWeightedRoundRobin:
    """Stateful picker; candidates may change between calls (state of vanished ids is dropped)."""

    def __init__(self) -> None:
        self._current: dict[str, float] = {}

    def pick(self, weighted: Sequence[tuple[str, float]]) -> str:
        """Pick one id from (id, weight > 0) pairs. Ties go to the earlier pair."""
        if not weighted:
            raise ValueError("no candidates to pick from")
        present = {worker_id for worker_id, _ in weighted}
        self._current = {k: v for k, v in self._current.items() if k in present}
        total = 0.0
        best_id, best_value = "", float("-inf")
        for worker_id, weight in weighted:
            value = self._current.get(worker_id, 0.0) + weight
            self._current[worker_id] = value
            total += weight
            if value > best_value:
                best_id, best_value = worker_id, value
        self._current[best_id] -= total
        return best_id
