"""Small factories for scheduler tests."""

from __future__ import annotations

from epd.common.roles import Role
from epd.scheduler.config import SchedulerConfig
from epd.scheduler.core import Scheduler
from epd.scheduler.model import WorkerSpec


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def spec(
    worker_id: str,
    role: Role = Role.ENCODE,
    *,
    port: int = 0,
    device: str = "cpu",
    weight: float = 1.0,
    model: str = "m",
    capacity: int = 1,
) -> WorkerSpec:
    port = port or 5000 + sum(map(ord, worker_id)) % 1000
    return WorkerSpec(worker_id, role, f"127.0.0.1:{port}", model, device, weight, capacity)


def create_scheduler(
    *specs: WorkerSpec, clock: FakeClock | None = None, **config: object
) -> tuple[Scheduler, FakeClock]:
    clock = clock or FakeClock()
    scheduler = Scheduler(SchedulerConfig(**config), clock)  # type: ignore[arg-type]
    for worker_spec in specs:
        scheduler.register(worker_spec)
    return scheduler, clock
