"""What the scheduler knows about workers, as plain dataclasses (no grpc, no torch)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from epd.common.roles import Role


class Policy(enum.Enum):
    """Encoder assignment policy (mirrors epd.v1.EncoderPolicy)."""

    PER_IMAGE = "per_image"
    PER_REQUEST = "per_request"
    ADAPTIVE = "adaptive"


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """A worker's registration."""

    id: str
    role: Role
    endpoint: str
    model: str
    device: str = "cpu"
    weight: float = 1.0
    capacity: int = 1
    host_id: str = ""
    embeddings_device: str = "cpu"


@dataclass(frozen=True, slots=True)
class Load:
    """A worker's load as of its latest heartbeat."""

    queue_depth: int = 0
    num_in_flight: int = 0
    item_latency_ms: float = 0.0
    kv_usage: float = 0.0
    batches_finished: int = 0  # encoders: a new batch's figure when it grew (0: not reported)


@dataclass(slots=True)
class RegisteredWorker:
    """One registry entry: the registration, its lease and what the scheduler tracks."""

    spec: WorkerSpec
    lease_id: str
    last_heartbeat: float
    load: Load = field(default_factory=Load)
    num_assigned_in_flight: int = 0
    draining: bool = False
    has_left: bool = False  # removed from the registry (its id may be registered again)
    id: str = field(init=False)  # the spec's, read at every placement

    def __post_init__(self) -> None:
        self.id = self.spec.id


@dataclass(frozen=True, slots=True)
class EncodeItem:
    """One image to place: its hash (for cache affinity) and cost in vision tokens."""

    mm_hash: str = ""
    num_tokens: int = 1


@dataclass(frozen=True, slots=True)
class ItemOutcome:
    """How one assigned item went (reported by the route)."""

    item_index: int
    latency_ms: float = 0.0
    cache_hit: bool = False
    failed: bool = False


@dataclass(frozen=True, slots=True)
class Assignment:
    """Where each item of a request goes."""

    assignment_id: str
    policy: Policy
    worker_ids: tuple[str, ...]
    endpoints: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one request runs (``Scheduler.place``)."""

    prefill: RegisteredWorker
    num_cached_blocks: int  # leading blocks of the prompt the prefill worker is believed to hold
    decode: RegisteredWorker | None  # None: the prefill worker decodes itself
    encoders: Assignment | None  # None: the request named no items
