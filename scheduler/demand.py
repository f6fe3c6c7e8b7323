"""How many encoders of each kind the current arrivals need: the autoscaling signal (no grpc).

The scheduler sees every image at arrival (``Place``, or ``AssignEncoders`` for a retry's
items), in mean-sized units (an item of ``num_tokens`` vision tokens counts ``num_tokens`` over
the running mean, as the adaptive policy costs it), and learns what one unit costs on each
encoder. For each (model, kind), the kind being the device type of the encoders (``cpu``,
``cuda``, ``xpu``):

- arrivals ``λ``: units assigned to encoders of that kind per second, an exponentially weighted
  rate over ``smoothing_s``, less the share that the encoders answer from their caches lately;
- cost ``S``: the mean learned service time of one unit on the kind's live encoders, smoothed
  over time with the same time constant (each encoder's estimate moves with every batch);
- offered load ``A = λ·S``: encoders kept busy on average;
- backlog ``B``: the encoder-seconds of work assigned and not yet done.

The number needed is the fewest ``n`` encoders with ``n > A`` whose expected wait before
encoding, as an M/M/n queue (Erlang C: ``W = C(n, A)·S / (n - A)``), is at most the target, and
which also clear the backlog within the target while keeping up (``n >= A + B / target``); 0 when
nothing arrives and nothing waits. A kind whose cost is not measured yet needs what it runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

# The needed count never exceeds the offered load by more than this (a guard for a tiny target).
MAX_HEADROOM = 1000
# Arrivals below this many images per second count as none (what is left of a past burst).
MIN_RATE = 1e-3


def device_kind(device: str) -> str:
    """``cuda:1`` -> ``cuda``; an encoder's device as registered, reduced to its type."""
    return device.partition(":")[0].strip().lower() or "cpu"


@dataclass(slots=True)
class DecayingRate:
    """An amount per second, exponentially weighted over ``time_constant_s``."""

    time_constant_s: float
    _value: float = 0.0
    _at: float | None = None

    def add(self, amount: float, now: float) -> None:
        """Count ``amount`` happening at ``now``."""
        self._value = self._decayed(now) + amount
        self._at = now

    def rate(self, now: float) -> float:
        """Amount per second as of ``now``."""
        return self._decayed(now) / self.time_constant_s

    def _decayed(self, now: float) -> float:
        if self._at is None:
            return 0.0
        return self._value * math.exp(-max(0.0, now - self._at) / self.time_constant_s)


def erlang_c_wait_s(num_servers: int, load: float, service_s: float) -> float:
    """Expected wait before service in an M/M/n queue of ``num_servers`` servers, offered
    ``load`` (arrival rate x ``service_s``); infinite when ``load >= num_servers``."""
    if load <= 0:
        return 0.0
    if load >= num_servers:
        return math.inf
    blocking = 1.0  # NOTE: Erlang B by its stable recurrence, then C from B
    for k in range(1, num_servers + 1):
        blocking = load * blocking / (k + load * blocking)
    waiting = num_servers * blocking / (num_servers - load * (1 - blocking))
    return waiting * service_s / (num_servers - load)


def encoders_needed(load: float, service_s: float, backlog_s: float, target_wait_s: float) -> int:
    """The fewest encoders that keep the expected encode wait under ``target_wait_s`` (module
    docstring); 0 when there is neither load nor backlog."""
    if load <= 0 and backlog_s <= 0:
        return 0
    needed = max(1, math.ceil(load + backlog_s / target_wait_s - 1e-9))
    if needed <= load:
        needed = math.floor(load) + 1
    limit = needed + MAX_HEADROOM
    while needed < limit and erlang_c_wait_s(needed, load, service_s) > target_wait_s:
        needed += 1
    return needed


@dataclass(slots=True)
class SmoothedValue:
    """A value followed over time, exponentially weighted with ``time_constant_s``."""

    time_constant_s: float
    value: float | None = None
    _at: float = 0.0

    def update(self, sample: float, now: float) -> float:
        """Fold in ``sample`` seen at ``now``; the smoothed value."""
        if self.value is None:
            self.value = sample
        else:
            weight = 1 - math.exp(-max(0.0, now - self._at) / self.time_constant_s)
            self.value += weight * (sample - self.value)
        self._at = now
        return self.value


@dataclass(frozen=True, slots=True)
class EncoderDemand:
    """The signal for one kind of encoder of one model."""

    model: str
    device: str
    num_live: int
    num_needed: int
    arrival_rate: float  # mean-sized images per second that the encoders must compute
    load: float  # encoders busy on average: arrival_rate x item_s
    item_s: float | None  # learned cost of one mean-sized image here (None: not measured)
    backlog_s: float  # encoder-seconds assigned and not done
    cache_hit_ratio: float  # share of the assigned images answered from the encoders' caches


@dataclass(frozen=True, slots=True)
class KindState:
    """What the scheduler knows now of the live encoders of one (model, kind)."""

    num_live: int
    item_ms: tuple[float, ...]  # the learned costs of those that have one
    backlog_s: float


@dataclass(slots=True)
class KindArrivals:
    """The arrivals and cache outcomes of one (model, kind): each encoder holds its kind's from
    registration on, so an arrival is counted without looking its kind up."""

    units: DecayingRate
    hit_units: DecayingRate
    done_units: DecayingRate
    cost_s: SmoothedValue

    def arrived(self, units: float, now: float) -> None:
        """``units`` of work assigned to an encoder of this kind at ``now``."""
        self.units.add(units, now)

    def done(self, units: float, cache_hit: bool, now: float) -> None:
        """An assigned item of ``units`` reported done, from the cache or computed."""
        self.done_units.add(units, now)
        if cache_hit:
            self.hit_units.add(units, now)


@dataclass(slots=True)
class DemandTracker:
    """Arrivals and cache outcomes per (model, kind), and the demand they make."""

    smoothing_s: float
    target_wait_s: float
    _by_kind: dict[tuple[str, str], KindArrivals] = field(default_factory=dict)

    def arrivals(self, key: tuple[str, str]) -> KindArrivals:
        """The counters of ``key`` = (model, ``device_kind``), made on first use."""
        if key not in self._by_kind:
            self._by_kind[key] = KindArrivals(
                DecayingRate(self.smoothing_s),
                DecayingRate(self.smoothing_s),
                DecayingRate(self.smoothing_s),
                SmoothedValue(self.smoothing_s),
            )
        return self._by_kind[key]

    def demand(self, kinds: dict[tuple[str, str], KindState], now: float) -> list[EncoderDemand]:
        """The demand of every (model, kind) with live encoders or recent arrivals."""
        recent = {k for k, a in self._by_kind.items() if a.units.rate(now) > MIN_RATE}
        keys = sorted(set(kinds) | recent)
        return [self._demand(key, kinds.get(key, KindState(0, (), 0.0)), now) for key in keys]

    def _demand(self, key: tuple[str, str], state: KindState, now: float) -> EncoderDemand:
        arrivals = self.arrivals(key)
        done = arrivals.done_units.rate(now)
        hit_ratio = min(1.0, arrivals.hit_units.rate(now) / done) if done > 0 else 0.0
        rate = arrivals.units.rate(now) * (1 - hit_ratio)
        rate = rate if rate > MIN_RATE else 0.0  # NOTE: what is left of arrivals long past
        item_s = None
        if state.item_ms:
            item_s = arrivals.cost_s.update(_mean(state.item_ms) / 1000, now)
        if item_s is None:
            load, needed = 0.0, state.num_live
        else:
            load = rate * item_s
            needed = encoders_needed(load, item_s, state.backlog_s, self.target_wait_s)
        return EncoderDemand(
            *key, state.num_live, needed, rate, load, item_s, state.backlog_s, hit_ratio
        )


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values)
