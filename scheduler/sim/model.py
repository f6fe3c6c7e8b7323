"""What the simulator models: encoders (service time, batching, cache) and workloads."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

REFERENCE_TOKENS = 1024


@dataclass(frozen=True, slots=True)
class SimEncoder:
    """An encoder: a batch of images totalling n reference-sized images (``REFERENCE_TOKENS``
    vision tokens each) takes ``fixed_ms + per_image_ms * n``; the first batch after each
    (re)start takes ``cold_start_ms`` more (kernel compilation, allocator and cache warm-up);
    each batch takes a factor drawn uniformly in ``1 +- jitter`` of that (contention, clocks)."""

    name: str
    device: str
    per_image_ms: float
    fixed_ms: float = 0.0
    max_batch: int = 1
    weight: float = 1.0
    cache_items: int = 256
    cold_start_ms: float = 0.0
    jitter: float = 0.0

    def batch_ms(self, num_images: float) -> float:
        return self.fixed_ms + self.per_image_ms * num_images


@dataclass(frozen=True, slots=True)
class Restart:
    """Encoder ``name`` deregisters at ``down_s`` (finishing what it holds), then registers
    afresh at ``up_s``: a new process, cold, its cache empty."""

    name: str
    down_s: float
    up_s: float


@dataclass(frozen=True, slots=True)
class Scenario:
    """A deployment and a workload, run once per policy with the same random draws."""

    name: str
    description: str
    encoders: tuple[SimEncoder, ...]
    arrival_rps: float
    image_mix: dict[int, float] = field(default_factory=lambda: {1: 0.5, 2: 0.3, 4: 0.2})
    # vision tokens per image -> probability; one entry means every image has that size
    token_mix: dict[int, float] = field(default_factory=lambda: {REFERENCE_TOKENS: 1.0})
    split_ratio: tuple[float, float] | None = None
    repeat_probability: float = 0.0
    repeat_pool: int = 32
    restarts: tuple[Restart, ...] = ()
    # the split counts requests arriving from here on (default: after the warm-up)
    split_from_s: float | None = None
    duration_s: float = 120.0
    warmup_s: float = 10.0
    seed: int = 0


GPU_MS, CPU_MS = 10.0, 80.0
TWINS = (
    SimEncoder("gpu-a", "cuda:0", GPU_MS, jitter=0.05),
    SimEncoder("gpu-b", "cuda:0", GPU_MS * 1.02, jitter=0.05),
)

SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "seed-8x",
        "accelerator 8x faster than CPU; per_image round robin (Dynamo's default) "
        "vs per_request with the right split ratio 8:1",
        (SimEncoder("accel", "cuda:0", GPU_MS), SimEncoder("cpu", "cpu", CPU_MS)),
        arrival_rps=45.0,
        split_ratio=(8.0, 1.0),
    ),
    Scenario(
        "wrong-ratio",
        "8:1 reality but split ratio configured 1:1",
        (SimEncoder("accel", "cuda:0", GPU_MS), SimEncoder("cpu", "cpu", CPU_MS)),
        arrival_rps=45.0,
        split_ratio=(1.0, 1.0),
    ),
    Scenario(
        "balanced",
        "two equal CPU encoders",
        (SimEncoder("cpu-a", "cpu", 40.0), SimEncoder("cpu-b", "cpu", 40.0)),
        arrival_rps=20.0,
    ),
    Scenario(
        "batching",
        "accelerator with batching (5 ms + 4 ms/image, up to 8) beside a CPU",
        (
            SimEncoder("accel", "cuda:0", 4.0, fixed_ms=5.0, max_batch=8),
            SimEncoder("cpu", "cpu", CPU_MS),
        ),
        arrival_rps=55.0,
        split_ratio=(8.0, 1.0),
    ),
    Scenario(
        "mixed-sizes",
        "image sizes vary 16x (256 to 4096 vision tokens), right ratio 8:1",
        (SimEncoder("accel", "cuda:0", GPU_MS), SimEncoder("cpu", "cpu", CPU_MS)),
        arrival_rps=40.0,
        split_ratio=(8.0, 1.0),
        token_mix={256: 0.6, 1024: 0.3, 4096: 0.1},
    ),
    Scenario(
        "repeated-images",
        "half the images repeat from a pool of 32 (cache reuse), 2 CPUs",
        (SimEncoder("cpu-a", "cpu", 40.0), SimEncoder("cpu-b", "cpu", 40.0)),
        arrival_rps=24.0,
        repeat_probability=0.5,
    ),
    Scenario(
        "twins",
        "two encoders of one model, measured 2% apart, 5% jitter, single images",
        TWINS,
        arrival_rps=30.0,
        image_mix={1: 1.0},
    ),
    Scenario(
        "rejoin",
        "twins; gpu-b restarts at 40 s, back at 45 s with a 3 s cold first batch; "
        "split after the rejoin",
        tuple(replace(e, cold_start_ms=3000.0) for e in TWINS),
        arrival_rps=30.0,
        image_mix={1: 1.0},
        restarts=(Restart("gpu-b", 40.0, 45.0),),
        split_from_s=45.0,
    ),
)
