"""Encoder assignment policies: which encoder encodes each image of a request.

- ``PerImagePolicy``: each image to the next encoder by smooth weighted round robin, so one
  request's images spread over encoders (and wait for the slowest).
- ``PerRequestPolicy``: the whole request to one encoder by smooth weighted round robin.
- ``AdaptivePolicy``: list scheduling by least expected completion time. Each encoder's per-item
  service time is learned (EWMA, see ``encoder_costs.py``; encoders compared by one
  kind of figure, see ``AdaptivePolicy.service_times``); its backlog is the work the scheduler
  assigned and not yet saw completed (or what it reports, if more). Images go one by one to the
  encoder that would finish them first, an image already in an encoder's cache costing almost
  nothing there.
  A slow encoder thus gets exactly the work it finishes sooner than the fast one would: none at
  low load, its useful share under load. Without statistics it falls back to the weights.
  Items are costed by size: an item of ``num_tokens`` vision tokens counts ``num_tokens`` over the
  running mean size of the items seen (1 when sizes are unknown), so big images go where they
  finish first. Two guards keep the estimates true: an idle encoder whose estimate is stale (no
  fresh sample for a while, see ``EncoderView.is_stale``) is probed with one item, and encoders
  whose completion times differ by less than ``NEAR_TIE`` of an item count as tied (ties rotate),
  so measurement noise between identical encoders does not send all the work to one of them.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

from epd.common.errors import InvalidArgument
from epd.scheduler.model import EncodeItem, Policy
from epd.scheduler.policies.swrr import SmoothWeightedRoundRobin

CACHE_HIT_COST = 0.05
# completion times closer than this share of the item's fastest service time are a tie
NEAR_TIE = 0.25


@dataclass(slots=True)
class Ewma:
    """Exponentially weighted moving average; ``value`` is None until the first sample."""

    alpha: float = 0.3
    value: float | None = None

    def add(self, sample: float) -> None:
        """Fold in one sample (non-positive samples are ignored)."""
        if sample <= 0:
            return
        self.value = (
            sample if self.value is None else (self.alpha * sample + (1 - self.alpha) * self.value)
        )


@dataclass(frozen=True, slots=True)
class EncoderView:
    """What a policy sees of one live encoder."""

    id: str
    device: str = "cpu"
    weight: float = 1.0
    backlog_items: int = 0
    service_ms: float | None = None
    # the two figures service_ms is the better of (the encoder's own first): the encoder's own
    # (compute per item, from its heartbeats) and the scheduler's (inferred from completions)
    own_ms: float | None = None
    inferred_ms: float | None = None
    backlog_ms: float | None = None
    cached: frozenset[str] = field(default_factory=frozenset)
    # no fresh service-time sample for longer than the probe horizon: send it work to learn
    is_stale: bool = False

    @property
    def is_accelerator(self) -> bool:
        return not self.device.lower().startswith("cpu")


def parse_split_ratio(text: str) -> tuple[float, float]:
    """Parse "ACCELERATOR:CPU" shares such as "8:1" (weights for non-CPU and CPU encoders)."""
    parts = text.split(":")
    if len(parts) != 2:
        raise InvalidArgument(
            f"split ratio {text!r} must be ACCELERATOR:CPU, e.g. 8:1", reason="BAD_SPLIT_RATIO"
        )
    try:
        shares = tuple(float(part) for part in parts)
    except ValueError:
        raise InvalidArgument(
            f"split ratio {text!r} must hold two numbers, e.g. 8:1", reason="BAD_SPLIT_RATIO"
        ) from None
    if not all(math.isfinite(s) and s > 0 for s in shares):
        raise InvalidArgument(
            f"split ratio {text!r} needs two positive shares, e.g. 8:1", reason="BAD_SPLIT_RATIO"
        )
    return shares[0], shares[1]


def weights_of(
    encoders: Sequence[EncoderView], split_ratio: tuple[float, float] | None
) -> list[tuple[str, float]]:
    """(id, weight) per encoder: the split ratio by device class when given, else own weights."""
    if split_ratio is None:
        return [(e.id, e.weight) for e in encoders]
    return [(e.id, split_ratio[0] if e.is_accelerator else split_ratio[1]) for e in encoders]


class EncoderPolicy(ABC):
    """Maps the items of one request to encoder ids. Not thread-safe: callers serialise."""

    policy: Policy

    @abstractmethod
    def assign(self, items: Sequence[EncodeItem], encoders: Sequence[EncoderView]) -> list[str]:
        """One encoder id per item, in item order. ``encoders`` is non-empty, ordered by id."""


class PerImagePolicy(EncoderPolicy):
    """Each image to the next encoder by smooth weighted round robin."""

    policy = Policy.PER_IMAGE

    def __init__(self, split_ratio: tuple[float, float] | None = None) -> None:
        self.split_ratio = split_ratio
        self._picker = SmoothWeightedRoundRobin()

    def assign(self, items: Sequence[EncodeItem], encoders: Sequence[EncoderView]) -> list[str]:
        weighted = weights_of(encoders, self.split_ratio)
        return [self._picker.pick(weighted) for _ in items]


class PerRequestPolicy(EncoderPolicy):
    """All images of a request to one encoder by smooth weighted round robin."""

    policy = Policy.PER_REQUEST

    def __init__(self, split_ratio: tuple[float, float] | None = None) -> None:
        self.split_ratio = split_ratio
        self._picker = SmoothWeightedRoundRobin()

    def assign(self, items: Sequence[EncodeItem], encoders: Sequence[EncoderView]) -> list[str]:
        chosen = self._picker.pick(weights_of(encoders, self.split_ratio))
        return [chosen] * len(items)


class AdaptivePolicy(EncoderPolicy):
    """Least expected completion time over learned service times, cache-aware."""

    policy = Policy.ADAPTIVE

    def __init__(self, split_ratio: tuple[float, float] | None = None) -> None:
        self.split_ratio = split_ratio
        self._turn = 0
        self._mean_tokens = Ewma(alpha=0.05)

    def observe(self, items: Sequence[EncodeItem]) -> None:
        """Fold the sizes of a request's items into the running mean; the scheduler calls it
        once per request whatever the policy, before ``assign``."""
        for item in items:
            self._mean_tokens.add(item.num_tokens)

    def units(self, item: EncodeItem) -> float:
        """Cost of ``item`` in mean-sized items (service times are learned per such unit);
        1 before any size was observed."""
        mean = self._mean_tokens.value
        return item.num_tokens / mean if mean else 1.0

    def assign(self, items: Sequence[EncodeItem], encoders: Sequence[EncoderView]) -> list[str]:
        service = self.service_times(encoders)
        finish = {
            e.id: e.backlog_ms if e.backlog_ms is not None else e.backlog_items * service[e.id]
            for e in encoders
        }
        # NOTE: ties (e.g. idle twins) rotate instead of always going to the first encoder.
        self._turn = (self._turn + 1) % len(encoders)
        encoders = [*encoders[self._turn :], *encoders[: self._turn]]
        probes = [e for e in encoders if e.is_stale and not e.backlog_items]
        chosen: list[str] = []
        for item in items:
            work = {e.id: service[e.id] * self.cost(item, e) for e in encoders}
            if probes and not any(item.mm_hash and item.mm_hash in e.cached for e in encoders):
                best = probes.pop(0)
            else:  # NOTE: the first (rotated) encoder finishing within a near tie of the best
                completion = {e.id: finish[e.id] + work[e.id] for e in encoders}
                limit = min(completion.values()) + NEAR_TIE * min(work.values())
                best = next(e for e in encoders if completion[e.id] <= limit)
            finish[best.id] += work[best.id]
            chosen.append(best.id)
        return chosen

    def cost(self, item: EncodeItem, encoder: EncoderView) -> float:
        """Cost of ``item`` on ``encoder`` in mean-sized items (almost nothing if cached there)."""
        hit = bool(item.mm_hash) and item.mm_hash in encoder.cached
        return CACHE_HIT_COST if hit else self.units(item)

    def service_times(self, encoders: Sequence[EncoderView]) -> dict[str, float]:
        """Per-item service time per encoder, one kind of figure for all: their own figures
        when each has one, else the inferred ones (an encoder with none inferred: its own). The
        encoder's own figure is its compute alone, the inferred one everything around it too,
        so one encoder's own against another's inferred would make the first look faster than
        it is. Unknown ones come from the weights, scaled to the known ones."""
        weights = dict(weights_of(encoders, self.split_ratio))
        if all(e.own_ms for e in encoders) or not any(e.own_ms for e in encoders):
            measured = {e.id: e.own_ms or e.service_ms for e in encoders}
        else:
            measured = {e.id: e.inferred_ms or e.own_ms for e in encoders}
        known = [ms * weights[e.id] for e in encoders if (ms := measured[e.id])]
        scale = sorted(known)[len(known) // 2] if known else 1.0
        return {e.id: measured[e.id] or scale / weights[e.id] for e in encoders}
