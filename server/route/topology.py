"""Which path a request takes, decided from the roles registered (no code change per topology).

- Images and a live encoder: the encoders make embeddings, and any worker that takes embeddings
  (prefill_decode, prefill, encode_prefill) may prefill: E/PD, E/P/D.
- Images and no encoder: the raw images go to an encode_prefill worker: EPD, EP/D.
- The chosen worker decides the rest: a ``prefill`` worker hands its KV to a decode worker
  (Prefill, ChooseDecode, Decode); so does an ``encode_prefill`` worker when decode workers are
  live; everything else streams PrefillDecode.

The roles come from the scheduler's ListWorkers through a ``RoleView``, fed every listing the
route's one refresh loop fetches (``scheduler_fallback.FallbackScheduler.watch``), off the
requests' path.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from epd.common.errors import NotFound
from epd.common.roles import Role, known_role
from epd.v1 import scheduler_service_pb2 as scheduler_pb

if TYPE_CHECKING:
    from epd.server.route.request import Deadline

EMBEDDING_CONSUMERS = (Role.PREFILL_DECODE, Role.PREFILL, Role.ENCODE_PREFILL)
# A view older than this many TTLs is not served: the request waits for a fresh one. 10 TTLs
# (10 s at the default TTL) is the scheduler's default lease TTL: a worker that died stays live
# in its listing that long anyway, and the route's retries cover a worker gone since.
MAX_AGE_TTLS = 10
ListWorkers: TypeAlias = Callable[[float | None], Awaitable[scheduler_pb.ListWorkersResponse]]


@dataclass(frozen=True, slots=True)
class Plan:
    """How one request runs: encode on encoders or not, which roles may prefill it, and whether
    decode workers are live (a worker that can hand its KV over then does: ``hands_off_kv``)."""

    uses_encoders: bool
    prefill_roles: tuple[Role, ...]
    is_decode_live: bool = False


def plan_for(live_roles: frozenset[Role], num_images: int) -> Plan:
    """The plan for a request with ``num_images`` images given the roles live now."""
    is_decode_live = Role.DECODE in live_roles
    if num_images and Role.ENCODE not in live_roles and Role.ENCODE_PREFILL in live_roles:
        return Plan(False, (Role.ENCODE_PREFILL,), is_decode_live)
    return Plan(num_images > 0, EMBEDDING_CONSUMERS, is_decode_live)


def can_serve(live_roles: frozenset[Role], num_media: int) -> bool:
    """Whether ``live_roles`` serve a request with ``num_media`` images and videos on its plan
    (``plan_for``): an encoder for its media where the plan uses one, and a worker to prefill
    it that needs no decode worker or has one."""
    plan = plan_for(live_roles, num_media)
    if plan.uses_encoders and Role.ENCODE not in live_roles:
        return False
    finishing = {Role.PREFILL_DECODE, Role.ENCODE_PREFILL}
    if plan.is_decode_live:
        finishing.add(Role.PREFILL)
    return any(role in finishing for role in plan.prefill_roles if role in live_roles)


class RoleView:
    """The set of live roles per model, and the models of every registered worker (live or not,
    ``models``), from the scheduler's ListWorkers: each listing the scheduler client's watch
    fetches is handed to ``update`` (``Peers``); no longer served after ``max_age_s`` (default
    ``MAX_AGE_TTLS`` TTLs), and a request finding no live role of its model asks for a listing at
    most once per ``ttl_s``."""

    def __init__(self, ttl_s: float = 1.0, max_age_s: float | None = None) -> None:
        if ttl_s <= 0 or (max_age_s is not None and max_age_s < ttl_s):
            raise ValueError("ttl_s must be positive and max_age_s at least ttl_s")
        self.ttl_s = ttl_s
        self.max_age_s = MAX_AGE_TTLS * ttl_s if max_age_s is None else max_age_s
        self._roles: dict[str, frozenset[Role]] = {}
        self.models: frozenset[str] = frozenset()
        self._fetched_at = -float("inf")
        # when a request last waited for a listing for want of its model's roles
        self._asked_at = -float("inf")

    def is_expired(self, now: float | None = None) -> bool:
        """Whether the view is too old to serve (or was never fetched)."""
        return self._age(now) > self.max_age_s

    async def live_roles(
        self,
        model: str,
        served_here: str,
        list_workers: ListWorkers,
        deadline: Deadline,
        num_media: int = 0,
    ) -> frozenset[Role]:
        """The live roles of ``model`` (empty: the only model's), a NotFound
        (``MODEL_NOT_FOUND``) for a model neither registered nor ``served_here`` (the route's
        own), before anything of the request is loaded. The view is refreshed first only where
        it is expired, or cannot serve a request with ``num_media`` images and videos
        (``can_serve``: a model just registered, workers that registered or came back since the
        watch's last listing: at most once per TTL): the request waits for that ListWorkers
        (within the request's ``deadline``) and a failure of it is the request's;
        ``list_workers(timeout_s)`` is the scheduler's ListWorkers. Any other view is served as
        it is: the watch refreshes it."""
        now = time.monotonic()
        if self.is_expired(now) or (
            not can_serve(self.roles(model), num_media) and now - self._asked_at > self.ttl_s
        ):
            self._asked_at = now
            self.update(await list_workers(deadline.remaining()))
        served = self.models | {served_here}
        if model and model not in served:
            names = ", ".join(_shortened(name) for name in sorted(served))
            shown = _shortened(model)
            raise NotFound(
                f"model {shown!r} is not served here; served models: {names}",
                reason="MODEL_NOT_FOUND",
                metadata={"model": shown},
            )
        return self.roles(model)

    def update(self, listing: scheduler_pb.ListWorkersResponse, now: float | None = None) -> None:
        """Replace the view with the live workers of ``listing`` (those of a role this build
        does not know left out)."""
        roles: dict[str, set[Role]] = {}
        for worker in listing.workers:
            role = known_role(worker.info.role)
            if worker.state == scheduler_pb.WORKER_STATE_LIVE and role is not None:
                roles.setdefault(worker.info.model, set()).add(role)
        self._roles = {model: frozenset(found) for model, found in roles.items()}
        self.models = frozenset(worker.info.model for worker in listing.workers)
        self._fetched_at = time.monotonic() if now is None else now

    def roles(self, model: str) -> frozenset[Role]:
        """Live roles of ``model`` (empty: those of every model, for the only-model case)."""
        if model in self._roles:
            return self._roles[model]
        if not model:
            return frozenset().union(*self._roles.values())
        return frozenset()

    def _age(self, now: float | None) -> float:
        return (time.monotonic() if now is None else now) - self._fetched_at


def _shortened(name: str, limit: int = 64) -> str:
    """``name`` cut to ``limit`` characters for an error: a caller's string is not echoed whole."""
    return name if len(name) <= limit else f"{name[:limit]}..."
