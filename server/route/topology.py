"""Which path a request takes, decided from the roles registered (no code change per topology).

- Images and a live encoder: the encoders make embeddings, and any worker that takes embeddings
  (prefill_decode, prefill, encode_prefill) may prefill: E/PD, E/P/D.
- Images and no encoder: the raw images go to an encode_prefill worker: EPD, EP/D.
- The chosen worker decides the rest: a ``prefill`` worker hands its KV to a decode worker
  (Prefill, ChooseDecode, Decode); so does an ``encode_prefill`` worker when decode workers are
  live; everything else streams PrefillDecode.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TypeAlias

from epd.v1 import scheduler_service_pb2 as scheduler_pb

Role: TypeAlias = scheduler_pb.WorkerRole
ENCODE = scheduler_pb.WORKER_ROLE_ENCODE
PREFILL = scheduler_pb.WORKER_ROLE_PREFILL
DECODE = scheduler_pb.WORKER_ROLE_DECODE
PREFILL_DECODE = scheduler_pb.WORKER_ROLE_PREFILL_DECODE
ENCODE_PREFILL = scheduler_pb.WORKER_ROLE_ENCODE_PREFILL
EMBEDDING_CONSUMERS: tuple[Role, ...] = (PREFILL_DECODE, PREFILL, ENCODE_PREFILL)


@dataclass(frozen=True, slots=True)
class Plan:
    """How one request runs: encode on encoders or not, and which roles may prefill it."""

    uses_encoders: bool
    prefill_roles: tuple[Role, ...]


def plan_for(live_roles: frozenset[Role], num_images: int) -> Plan:
    """The plan for a request with ``num_images`` images given the roles live now."""
    if num_images and ENCODE not in live_roles and ENCODE_PREFILL in live_roles:
        return Plan(uses_encoders=False, prefill_roles=(ENCODE_PREFILL,))
    return Plan(uses_encoders=num_images > 0, prefill_roles=EMBEDDING_CONSUMERS)


def hands_off_kv(role: Role, live_roles: frozenset[Role]) -> bool:
    """Whether a worker of ``role`` should Prefill and hand its KV to a decode worker."""
    return role == PREFILL or (role == ENCODE_PREFILL and DECODE in live_roles)


class RoleView:
    """The set of live roles per model, and the models of every registered worker (live or not),
    refreshed from ListWorkers at most every ``ttl_s``."""

    def __init__(self, ttl_s: float = 1.0) -> None:
        self.ttl_s = ttl_s
        self._roles: dict[str, frozenset[Role]] = {}
        self._models: frozenset[str] = frozenset()
        self._fetched_at = -float("inf")

    def is_stale(self, now: float | None = None) -> bool:
        """Whether the view should be refreshed."""
        return (time.monotonic() if now is None else now) - self._fetched_at > self.ttl_s

    def update(self, listing: scheduler_pb.ListWorkersResponse, now: float | None = None) -> None:
        """Replace the view with the live workers of ``listing``."""
        roles: dict[str, set[Role]] = {}
        for worker in listing.workers:
            if worker.state == scheduler_pb.WORKER_STATE_LIVE:
                roles.setdefault(worker.info.model, set()).add(worker.info.role)
        self._roles = {model: frozenset(found) for model, found in roles.items()}
        self._models = frozenset(worker.info.model for worker in listing.workers)
        self._fetched_at = time.monotonic() if now is None else now

    def models(self) -> frozenset[str]:
        """Models with a registered worker, live or not."""
        return self._models

    def roles(self, model: str) -> frozenset[Role]:
        """Live roles of ``model`` (empty: those of every model, for the only-model case)."""
        if model in self._roles:
            return self._roles[model]
        if not model:
            return frozenset().union(*self._roles.values())
        return frozenset()
