"""The event loop: requests arrive, the real Scheduler assigns images, encoders work, the
route reports completions and encoders heartbeat, all on one simulated clock."""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from epd.common.held_items import HeldReport
from epd.common.roles import Role
from epd.scheduler.config import SchedulerConfig
from epd.scheduler.core import Scheduler
from epd.scheduler.model import EncodeItem, ItemOutcome, Load, Policy, WorkerSpec
from epd.scheduler.sim.model import REFERENCE_TOKENS, Scenario, SimEncoder

HEARTBEAT_S = 1.0
CACHE_HIT_MS = 0.5


@dataclass(slots=True)
class _Request:
    arrival: float
    hashes: list[str]
    tokens: list[int]
    assignment_id: str = ""
    encoder_of: list[str] = field(default_factory=list)
    done_at: dict[int, float] = field(default_factory=dict)
    hits: set[int] = field(default_factory=set)


@dataclass(slots=True)
class _EncoderState:
    model: SimEncoder
    lease_id: str
    queue: deque[tuple[int, int]] = field(default_factory=deque)
    in_service: list[tuple[int, int, bool]] = field(default_factory=list)
    busy_until: float = 0.0
    busy_s: float = 0.0
    cache: OrderedDict[str, None] = field(default_factory=OrderedDict)
    recent_item_ms: float = 0.0
    batches_finished: int = 0
    is_cold: bool = True
    is_down: bool = False


@dataclass(frozen=True, slots=True)
class PolicyResult:
    """Figures of one policy on one scenario."""

    policy: str
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    completed: int
    utilisation: dict[str, float]
    # share of the images of requests arriving after ``Scenario.split_from_s``, per encoder
    split: dict[str, float] = field(default_factory=dict)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


class Simulation:
    """One scenario under one policy."""

    def __init__(self, scenario: Scenario, policy: Policy) -> None:
        self.scenario, self.policy = scenario, policy
        self.clock = _Clock()
        self.scheduler = Scheduler(
            SchedulerConfig(default_policy=policy, split_ratio=scenario.split_ratio, ttl_s=1e9),
            self.clock,
        )
        self.encoders: dict[str, _EncoderState] = {}
        for encoder in scenario.encoders:
            self.encoders[encoder.name] = _EncoderState(encoder, self._register(encoder))
        self.requests: list[_Request] = []
        # NOTE: its own stream, so scenarios without jitter keep their arrivals' draws
        self._noise = random.Random(f"{scenario.seed}-service")
        self._events: list[tuple[float, int, str, str]] = []
        self._sequence = 0

    def run(self) -> PolicyResult:
        rng = random.Random(self.scenario.seed)
        self._generate_arrivals(rng)
        self._push(HEARTBEAT_S, "heartbeat", "")
        for restart in self.scenario.restarts:
            self._push(restart.down_s, "down", restart.name)
            self._push(restart.up_s, "up", restart.name)
        while self._events:
            time_s, _, kind, name = heapq.heappop(self._events)
            if time_s > self.scenario.duration_s:
                break
            self.clock.now = time_s
            getattr(self, f"_on_{kind}")(name)
        return self._result()

    # ---- events
    def _on_arrival(self, index: str) -> None:
        request = self.requests[int(index)]
        items = [EncodeItem(h, t) for h, t in zip(request.hashes, request.tokens, strict=True)]
        assignment = self.scheduler.assign_encoders(items, policy=self.policy)
        request.assignment_id = assignment.assignment_id
        request.encoder_of = list(assignment.worker_ids)
        for item_index, worker_id in enumerate(assignment.worker_ids):
            self.encoders[worker_id].queue.append((int(index), item_index))
            self._start(worker_id)

    def _on_finish(self, name: str) -> None:
        state = self.encoders[name]
        batch, state.in_service = state.in_service, []
        for request_index, item_index, hit in batch:
            self._complete_item(state, request_index, item_index, hit, self.clock.now)
        self._start(name)

    def _on_heartbeat(self, _: str) -> None:
        for state in self.encoders.values():
            if state.is_down:
                continue
            load = Load(
                queue_depth=len(state.queue),
                item_latency_ms=state.recent_item_ms,
                batches_finished=state.batches_finished,
            )
            held = HeldReport(is_snapshot=True, added=tuple(state.cache))
            self.scheduler.heartbeat(state.lease_id, load, held=held)
        self._push(self.clock.now + HEARTBEAT_S, "heartbeat", "")

    def _on_down(self, name: str) -> None:
        state = self.encoders[name]
        state.is_down = True
        self.scheduler.deregister(state.lease_id)

    def _on_up(self, name: str) -> None:
        # NOTE: a new process: what the old one still held finishes, but only its own reports
        # reach the scheduler, and the newcomer starts cold with an empty cache.
        state = self.encoders[name]
        state.lease_id = self._register(state.model)
        state.cache.clear()
        state.is_cold, state.is_down, state.recent_item_ms = True, False, 0.0
        state.batches_finished = 0

    # ---- mechanics
    def _start(self, name: str) -> None:
        state = self.encoders[name]
        if state.in_service or not state.queue:
            return
        batch = [state.queue.popleft() for _ in range(min(state.model.max_batch, len(state.queue)))]
        misses = [(r, i) for r, i in batch if self.requests[r].hashes[i] not in state.cache]
        size = sum(self.requests[r].tokens[i] for r, i in misses) / REFERENCE_TOKENS
        duration_ms = state.model.batch_ms(size) if misses else CACHE_HIT_MS
        if state.model.jitter:
            duration_ms *= 1 + self._noise.uniform(-state.model.jitter, state.model.jitter)
        if state.is_cold:
            duration_ms += state.model.cold_start_ms
            state.is_cold = False
        if misses:
            state.recent_item_ms = duration_ms / len(misses)
            state.batches_finished += 1
        state.busy_until = self.clock.now + duration_ms / 1000
        state.busy_s += duration_ms / 1000
        state.in_service = [(r, i, (r, i) not in misses) for r, i in batch]
        self._push(state.busy_until, "finish", name)

    def _complete_item(
        self, state: _EncoderState, request_index: int, item_index: int, hit: bool, at: float
    ) -> None:
        request = self.requests[request_index]
        request.done_at[item_index] = at
        if hit:
            request.hits.add(item_index)
        state.cache[request.hashes[item_index]] = None
        state.cache.move_to_end(request.hashes[item_index])
        while len(state.cache) > state.model.cache_items:
            state.cache.popitem(last=False)
        group = [i for i, name in enumerate(request.encoder_of) if name == state.model.name]
        if all(i in request.done_at for i in group):
            outcomes = [
                ItemOutcome(i, (request.done_at[i] - request.arrival) * 1000, i in request.hits)
                for i in group
            ]
            self.scheduler.complete_encoding(
                request.assignment_id, outcomes, final=len(request.done_at) == len(request.hashes)
            )

    def _generate_arrivals(self, rng: random.Random) -> None:
        sizes, weights = zip(*self.scenario.image_mix.items(), strict=True)
        now, fresh = 0.0, 0
        while now < self.scenario.duration_s:
            now += rng.expovariate(self.scenario.arrival_rps)
            hashes = []
            for _ in range(rng.choices(sizes, weights)[0]):
                if rng.random() < self.scenario.repeat_probability:
                    hashes.append(f"pool-{rng.randrange(self.scenario.repeat_pool)}")
                else:
                    fresh += 1
                    hashes.append(f"img-{fresh}")
            self.requests.append(_Request(now, hashes, self._draw_tokens(rng, len(hashes))))
            self._push(now, "arrival", str(len(self.requests) - 1))

    def _draw_tokens(self, rng: random.Random, num_images: int) -> list[int]:
        sizes, weights = zip(*self.scenario.token_mix.items(), strict=True)
        if len(sizes) == 1:  # NOTE: no draws, so fixed-size scenarios keep their random stream
            return [sizes[0]] * num_images
        return rng.choices(sizes, weights, k=num_images)

    def _register(self, encoder: SimEncoder) -> str:
        name, device, weight = encoder.name, encoder.device, encoder.weight
        spec = WorkerSpec(name, Role.ENCODE, f"{name}:1", "sim", device, weight, encoder.max_batch)
        lease_id: str = self.scheduler.register(spec).lease_id
        return lease_id

    def _push(self, at: float, kind: str, name: str) -> None:
        self._sequence += 1
        heapq.heappush(self._events, (at, self._sequence, kind, name))

    def _result(self) -> PolicyResult:
        start, end = self.scenario.warmup_s, self.scenario.duration_s
        measured = [r for r in self.requests if start <= r.arrival < end]
        latencies, completed = [], 0
        for request in measured:
            done = (
                len(request.done_at) == len(request.hashes) and max(request.done_at.values()) <= end
            )
            completed += done
            finish = max(request.done_at.values()) if done else end
            latencies.append((finish - request.arrival) * 1000)
        window = end - start
        return PolicyResult(
            self.policy.value,
            completed / window,
            _percentile(latencies, 0.5),
            _percentile(latencies, 0.99),
            completed,
            {name: min(1.0, s.busy_s / end) for name, s in self.encoders.items()},
            self._split(),
        )

    def _split(self) -> dict[str, float]:
        split_from = self.scenario.split_from_s
        start = self.scenario.warmup_s if split_from is None else split_from
        counts = dict.fromkeys(self.encoders, 0)
        for request in self.requests:
            if start <= request.arrival < self.scenario.duration_s:
                for name in request.encoder_of:
                    counts[name] += 1
        total = sum(counts.values()) or 1
        return {name: count / total for name, count in counts.items()}


def simulate(scenario: Scenario) -> list[PolicyResult]:
    """Every policy on ``scenario``, same arrivals for each."""
    return [Simulation(scenario, policy).run() for policy in Policy]
