"""Which path a request takes, decided from the roles registered (no code change per topology).

- Images and a live encoder: the encoders make embeddings, and any worker that takes embeddings
  (prefill_decode, prefill, encode_prefill) may prefill: E/PD, E/P/D.
- Images and no encoder: the raw images go to an encode_prefill worker: EPD, EP/D.
- The chosen worker decides the rest: a ``prefill`` worker hands its KV to a decode worker
  (Prefill, ChooseDecode, Decode); so does an ``encode_prefill`` worker when decode workers are
  live; everything else streams PrefillDecode.

The roles come from the scheduler's ListWorkers through a ``RoleView``, which keeps the latest
listing and refreshes it off the requests' path (see ``RoleView``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeAlias

from epd.common.errors import EpdError
from epd.common.roles import Role, known_role
from epd.common.tasks import BackgroundCalls
from epd.v1 import scheduler_service_pb2 as scheduler_pb

EMBEDDING_CONSUMERS = (Role.PREFILL_DECODE, Role.PREFILL, Role.ENCODE_PREFILL)
# A view older than this many TTLs is not served: the request waits for a fresh one. 10 TTLs
# (10 s at the default TTL) is the scheduler's default lease TTL: a worker that died stays live
# in its listing that long anyway, and the route's retries cover a worker gone since.
MAX_AGE_TTLS = 10
# ListWorkers of a background refresh: calls the route waits for take the request's deadline.
REFRESH_TIMEOUT_S = 5.0
ListWorkers: TypeAlias = Callable[[float | None], Awaitable[scheduler_pb.ListWorkersResponse]]
logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Plan:
    """How one request runs: encode on encoders or not, and which roles may prefill it."""

    uses_encoders: bool
    prefill_roles: tuple[Role, ...]


def plan_for(live_roles: frozenset[Role], num_images: int) -> Plan:
    """The plan for a request with ``num_images`` images given the roles live now."""
    if num_images and Role.ENCODE not in live_roles and Role.ENCODE_PREFILL in live_roles:
        return Plan(uses_encoders=False, prefill_roles=(Role.ENCODE_PREFILL,))
    return Plan(uses_encoders=num_images > 0, prefill_roles=EMBEDDING_CONSUMERS)


class RoleView:
    """The set of live roles per model, and the models of every registered worker (live or not),
    from the scheduler's ListWorkers: stale after ``ttl_s``, no longer served after
    ``max_age_s`` (default ``MAX_AGE_TTLS`` TTLs)."""

    def __init__(self, ttl_s: float = 1.0, max_age_s: float | None = None) -> None:
        if ttl_s <= 0 or (max_age_s is not None and max_age_s < ttl_s):
            raise ValueError("ttl_s must be positive and max_age_s at least ttl_s")
        self.ttl_s = ttl_s
        self.max_age_s = MAX_AGE_TTLS * ttl_s if max_age_s is None else max_age_s
        self._roles: dict[str, frozenset[Role]] = {}
        self._models: frozenset[str] = frozenset()
        self._fetched_at = -float("inf")
        self._refresh_started_at = -float("inf")
        self._is_refreshing = False

    def is_stale(self, now: float | None = None) -> bool:
        """Whether the view should be refreshed."""
        return self._age(now) > self.ttl_s

    def is_expired(self, now: float | None = None) -> bool:
        """Whether the view is too old to serve (or was never fetched)."""
        return self._age(now) > self.max_age_s

    async def ensure_fit(
        self, model: str, list_workers: ListWorkers, timeout: Callable[[], float | None]
    ) -> None:
        """Make the view fit to answer a request of ``model``: a stale view is refreshed first
        only where it is expired or has no live role for ``model`` (a model just registered,
        workers back); the request waits for that ListWorkers and a failure of it is the
        request's. ``list_workers(timeout_s)`` is the scheduler's ListWorkers; ``timeout()``
        the request's time left. Any other stale view is served as it is (see
        ``refresh_in_background``)."""
        if self.is_stale() and (self.is_expired() or not self.roles(model)):
            self.update(await list_workers(timeout()))

    def refresh_in_background(self, list_workers: ListWorkers, background: BackgroundCalls) -> None:
        """If the view is stale, refresh it in ``background``: one refresh at a time, at most one
        started per TTL; a failure is logged and the view kept. Called once a request no longer
        waits on the route (after its first token), so the refresh is never on a request's
        path."""
        now = time.monotonic()
        if (
            not self.is_stale(now)
            or self._is_refreshing
            or now - self._refresh_started_at <= self.ttl_s
        ):
            return
        self._is_refreshing = True
        self._refresh_started_at = now
        background.start(self._refresh_quietly(list_workers))

    def update(self, listing: scheduler_pb.ListWorkersResponse, now: float | None = None) -> None:
        """Replace the view with the live workers of ``listing`` (those of a role this build
        does not know left out)."""
        roles: dict[str, set[Role]] = {}
        for worker in listing.workers:
            role = known_role(worker.info.role)
            if worker.state == scheduler_pb.WORKER_STATE_LIVE and role is not None:
                roles.setdefault(worker.info.model, set()).add(role)
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

    def _age(self, now: float | None) -> float:
        return (time.monotonic() if now is None else now) - self._fetched_at

    async def _refresh_quietly(self, list_workers: ListWorkers) -> None:
        try:
            self.update(await list_workers(REFRESH_TIMEOUT_S))
        except EpdError as e:
            logger.warning(
                "could not refresh the live roles (%s); serving those of %.1f s ago",
                e,
                self._age(None),
            )
        finally:
            self._is_refreshing = False
