"""The route's scheduler calls, kept answering while the scheduler cannot be reached.

``FallbackScheduler`` has the methods of ``SchedulerClient`` the route calls and delegates to
it. It keeps the scheduler's latest full ListWorkers listing (``refresh``, every second while
``watch`` runs), and hands each listing ``refresh`` gets, as ListWorkers would answer it, to
``on_listing`` (the route's ``RoleView``). When the scheduler is unreachable (a call fails
Unavailable without a reason of the scheduler's own, or ``refresh`` gets no answer) it answers
from that listing instead:

- ChoosePrefill, ChooseDecode, AssignEncoders: the live workers of the model and roles asked,
  minus the request's exclusions and the workers whose health check failed, in turn (round
  robin per kind). No KV or cache affinity, no learned encoder speeds. Place: those three
  together, as the scheduler composes them.
- ListWorkers: the listing minus the unhealthy workers (so the route's ``RoleView`` stays fresh).
- CompleteEncoding (a report): dropped.

Bounded staleness: the listing is used for at most ``fallback_s`` after it was fetched; past
that, and in a route that never reached the scheduler, calls fail UNAVAILABLE as they always
did. While degraded, ``refresh`` health-checks the listed workers (a draining worker reports
NOT_SERVING, a killed one does not answer) and asks the scheduler again; the route leaves
degraded mode once the scheduler lists again every worker still healthy (workers re-register
within seconds of its return), or ``REJOIN_GRACE_S`` after its first answer, whichever is first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from epd.common.errors import DeadlineExceeded, EpdError, Unavailable
from epd.common.roles import (
    DEFAULT_PREFILL_ROLES,
    Role,
    hands_off_kv,
    known_role,
    role_from_proto,
)
from epd.server.route.metrics import RouteMetrics
from epd.v1 import scheduler_service_pb2 as scheduler_pb

if TYPE_CHECKING:
    from epd.common.clients import SchedulerClient

# How long the route may serve from its last view by default: long enough
# for the scheduler's pod to be replaced and the workers to register again (about 12 s after
# its return, docs/deploy.md), short enough that workers added meanwhile are not ignored long.
DEFAULT_FALLBACK_S = 60.0
REFRESH_INTERVAL_S = 1.0
REFRESH_TIMEOUT_S = 2.0
HEALTH_TIMEOUT_S = 1.0
# Once the scheduler answers again, the route waits at most this long for every worker it still
# finds healthy to be back in the scheduler's listing before using the scheduler's choices.
REJOIN_GRACE_S = 15.0
LOCAL_ASSIGNMENT_PREFIX = "local-"
# reasons of an Unavailable that mean "no answer from the scheduler" (no ErrorInfo of its own)
UNREACHABLE_REASONS = frozenset({"UNAVAILABLE", "PEER_UNREACHABLE"})
HealthCheck = Callable[[str], Awaitable[bool]]
OnListing = Callable[[scheduler_pb.ListWorkersResponse], None]
Reply = TypeVar("Reply")
logger = logging.getLogger(__name__)


def is_unreachable(error: EpdError) -> bool:
    """Whether ``error`` says the scheduler did not answer (rather than answered no)."""
    return isinstance(error, Unavailable) and error.reason in UNREACHABLE_REASONS


class FallbackScheduler:
    """``client``'s calls, answered from the last listing while the scheduler is away.

    ``is_serving(endpoint)``: the worker's gRPC health check (True: SERVING; never raises).
    ``fallback_s``: how long after its fetch the listing may be used (0: never, calls fail as the
    scheduler's do). ``on_listing``: told each listing ``refresh`` gets (while degraded: the
    listing less the unhealthy workers). ``clock``: monotonic seconds (tests move it)."""

    def __init__(
        self,
        client: SchedulerClient,
        is_serving: HealthCheck,
        fallback_s: float = DEFAULT_FALLBACK_S,
        *,
        metrics: RouteMetrics | None = None,
        on_listing: OnListing = lambda listing: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if fallback_s < 0:
            raise ValueError("fallback_s must not be negative")
        self._client = client
        self._is_serving = is_serving
        self.fallback_s = fallback_s
        self._metrics = metrics
        self._on_listing = on_listing
        self._clock = clock
        self._listing: scheduler_pb.ListWorkersResponse | None = None
        self._listed_at = -float("inf")
        self._unhealthy: frozenset[str] = frozenset()
        self._degraded_since: float | None = None
        self._answered_since: float | None = None
        self._has_logged_expiry = False
        self._is_listing_failing = False
        self._turns: Counter[str] = Counter()
        self.num_local_choices = 0

    @property
    def is_degraded(self) -> bool:
        """Whether the scheduler was found unreachable and has not been used since."""
        return self._degraded_since is not None

    def is_fresh(self) -> bool:
        """Whether the last listing may still be served (within ``fallback_s`` of its fetch)."""
        return self._clock() - self._listed_at <= self.fallback_s and self._listing is not None

    # ---- the scheduler's calls
    async def ListWorkers(
        self, request: scheduler_pb.ListWorkersRequest, *, timeout: float | None = None
    ) -> scheduler_pb.ListWorkersResponse:
        reply = await self._call(
            lambda: self._client.ListWorkers(request, timeout=timeout),
            lambda: self._local_listing(request),
        )
        if not self.is_degraded and not request.role and not request.model:
            self._record(reply)
        return reply

    async def AssignEncoders(
        self, request: scheduler_pb.AssignEncodersRequest, *, timeout: float | None = None
    ) -> scheduler_pb.AssignEncodersResponse:
        return await self._call(
            lambda: self._client.AssignEncoders(request, timeout=timeout),
            lambda: self._local_assignment(request),
        )

    async def CompleteEncoding(
        self, request: scheduler_pb.CompleteEncodingRequest, *, timeout: float | None = None
    ) -> scheduler_pb.CompleteEncodingResponse:
        if request.assignment_id.startswith(LOCAL_ASSIGNMENT_PREFIX):
            return scheduler_pb.CompleteEncodingResponse()  # NOTE: the scheduler never made it
        return await self._call(
            lambda: self._client.CompleteEncoding(request, timeout=timeout),
            scheduler_pb.CompleteEncodingResponse,
        )

    async def ChoosePrefill(
        self, request: scheduler_pb.ChoosePrefillRequest, *, timeout: float | None = None
    ) -> scheduler_pb.ChoosePrefillResponse:
        return await self._call(
            lambda: self._client.ChoosePrefill(request, timeout=timeout),
            lambda: self._local_prefill(request),
        )

    async def ChooseDecode(
        self, request: scheduler_pb.ChooseDecodeRequest, *, timeout: float | None = None
    ) -> scheduler_pb.ChooseDecodeResponse:
        return await self._call(
            lambda: self._client.ChooseDecode(request, timeout=timeout),
            lambda: self._local_decode(request),
        )

    async def Place(
        self, request: scheduler_pb.PlaceRequest, *, timeout: float | None = None
    ) -> scheduler_pb.PlaceResponse:
        return await self._call(
            lambda: self._client.Place(request, timeout=timeout),
            lambda: self._local_place(request),
        )

    # ---- keeping the listing and the mode
    async def watch(self) -> None:
        """``refresh`` every ``REFRESH_INTERVAL_S`` until cancelled (started by ``Peers``)."""
        while True:
            await self.refresh()
            await asyncio.sleep(REFRESH_INTERVAL_S)

    async def refresh(self) -> None:
        """Fetch the scheduler's listing; while degraded, also health-check the workers of the
        last listing and leave degraded mode once the scheduler has them back."""
        listing = None
        try:
            listing = await self._client.ListWorkers(
                scheduler_pb.ListWorkersRequest(), timeout=REFRESH_TIMEOUT_S
            )
        except EpdError as e:
            if (is_unreachable(e) or isinstance(e, DeadlineExceeded)) and self.is_fresh():
                self._enter_degraded(e)
            elif not self._is_listing_failing:
                self._is_listing_failing = True
                logger.warning(
                    "could not refresh the workers' listing (%s); the route's view of the live "
                    "roles is kept",
                    e,
                )
        if not self.is_degraded:
            if listing is not None:
                self._record(listing)
                self._on_listing(listing)
            return
        await self._check_health()
        if listing is not None and self._has_rejoined(listing):
            self._leave_degraded(listing)
            self._on_listing(listing)
        elif self.is_fresh():
            self._on_listing(self._local_listing(scheduler_pb.ListWorkersRequest()))

    def _record(self, listing: scheduler_pb.ListWorkersResponse) -> None:
        self._listing, self._listed_at = listing, self._clock()
        self._is_listing_failing = False

    def _enter_degraded(self, error: EpdError) -> None:
        if self.is_degraded:
            return
        self._degraded_since, self._answered_since = self._clock(), None
        self._has_logged_expiry = False
        if self._metrics is not None:
            self._metrics.scheduler_fallback.set(1)
        logger.warning(
            "scheduler unreachable (%s): routing from its listing of %.1f s ago, for up to %.0f s",
            error,
            self._clock() - self._listed_at,
            self.fallback_s,
        )

    def _leave_degraded(self, listing: scheduler_pb.ListWorkersResponse | None) -> None:
        assert self._degraded_since is not None
        logger.warning(
            "scheduler back after %.1f s: %d requests were routed from the route's own view",
            self._clock() - self._degraded_since,
            self.num_local_choices,
        )
        self._degraded_since, self._answered_since = None, None
        self._unhealthy = frozenset()
        if listing is not None:
            self._record(listing)
        if self._metrics is not None:
            self._metrics.scheduler_fallback.set(0)

    def _has_rejoined(self, listing: scheduler_pb.ListWorkersResponse) -> bool:
        now = self._clock()
        if self._answered_since is None:
            self._answered_since = now
        listed = {w.info.id for w in listing.workers if w.state == scheduler_pb.WORKER_STATE_LIVE}
        expected = {w.info.id for w in self._usable()}
        return expected <= listed or now - self._answered_since >= REJOIN_GRACE_S

    async def _check_health(self) -> None:
        workers = [w.info for w in self._listing.workers] if self._listing is not None else []
        results = await asyncio.gather(*(self._checked(w.endpoint) for w in workers))
        unhealthy = frozenset(w.id for w, ok in zip(workers, results, strict=True) if not ok)
        if unhealthy - self._unhealthy:
            logger.warning("workers failing their health check: %s", sorted(unhealthy))
        self._unhealthy = unhealthy

    async def _checked(self, endpoint: str) -> bool:
        try:
            return await asyncio.wait_for(self._is_serving(endpoint), HEALTH_TIMEOUT_S)
        except TimeoutError:
            return False

    # ---- answers
    async def _call(
        self, remote: Callable[[], Awaitable[Reply]], local: Callable[[], Reply]
    ) -> Reply:
        if self.is_degraded and self.is_fresh():
            return local()
        try:
            reply = await remote()
        except Unavailable as e:
            if not is_unreachable(e) or not self.is_fresh():
                self._note_expiry()
                raise
            self._enter_degraded(e)
            return local()
        if self.is_degraded:
            self._leave_degraded(None)  # NOTE: the view had expired; the scheduler answers
        return reply

    def _note_expiry(self) -> None:
        if self.is_degraded and not self._has_logged_expiry:
            self._has_logged_expiry = True
            logger.warning(
                "the route's view of the workers is older than %.0f s: requests fail "
                "UNAVAILABLE until the scheduler answers",
                self.fallback_s,
            )

    def _usable(
        self, roles: Sequence[Role] = (), model: str = "", exclude: Sequence[str] = ()
    ) -> list[scheduler_pb.WorkerStatus]:
        """Live, healthy workers of the listing of ``roles`` (any) and ``model`` (any), by id."""
        workers = self._listing.workers if self._listing is not None else []
        usable = [
            w
            for w in workers
            if w.state == scheduler_pb.WORKER_STATE_LIVE
            and (not roles or known_role(w.info.role) in roles)
            and (not model or w.info.model == model)
            and w.info.id not in exclude
            and w.info.id not in self._unhealthy
        ]
        return sorted(usable, key=lambda w: w.info.id)

    def _next(self, kind: str, workers: list[scheduler_pb.WorkerStatus]) -> scheduler_pb.WorkerInfo:
        turn = self._turns[kind]
        self._turns[kind] += 1
        return workers[turn % len(workers)].info

    def _local_listing(
        self, request: scheduler_pb.ListWorkersRequest
    ) -> scheduler_pb.ListWorkersResponse:
        workers = self._listing.workers if self._listing is not None else []
        return scheduler_pb.ListWorkersResponse(
            workers=[
                w
                for w in workers
                if w.info.id not in self._unhealthy
                and (not request.role or w.info.role == request.role)
                and (not request.model or w.info.model == request.model)
            ]
        )

    def _local_assignment(
        self, request: scheduler_pb.AssignEncodersRequest
    ) -> scheduler_pb.AssignEncodersResponse:
        encoders = self._usable((Role.ENCODE,), request.model, request.exclude_worker_ids)
        if not encoders:
            raise _none_left("encoder", request.model, "NO_ENCODER")
        assignments = []
        for index in range(len(request.items)):
            encoder = self._next("encode", encoders)
            assignments.append(
                scheduler_pb.EncoderAssignment(
                    item_index=index, worker_id=encoder.id, endpoint=encoder.endpoint
                )
            )
        self._turns["assignment"] += 1
        return scheduler_pb.AssignEncodersResponse(
            assignment_id=f"{LOCAL_ASSIGNMENT_PREFIX}{self._turns['assignment']}",
            policy=request.policy,
            assignments=assignments,
        )

    def _local_prefill(
        self, request: scheduler_pb.ChoosePrefillRequest
    ) -> scheduler_pb.ChoosePrefillResponse:
        roles = [role_from_proto(role) for role in request.roles] or DEFAULT_PREFILL_ROLES
        workers = self._usable(roles, request.model, request.exclude_worker_ids)
        if not workers:
            raise _none_left("prefill worker", request.model, "NO_PREFILL_WORKER")
        self.num_local_choices += 1
        if self._metrics is not None:
            self._metrics.locally_routed.inc()
        return scheduler_pb.ChoosePrefillResponse(worker=self._next("prefill", workers))

    def _local_place(self, request: scheduler_pb.PlaceRequest) -> scheduler_pb.PlaceResponse:
        prefill = self._local_prefill(
            scheduler_pb.ChoosePrefillRequest(model=request.model, roles=request.prefill_roles)
        )
        reply = scheduler_pb.PlaceResponse(prefill=prefill)
        role = role_from_proto(prefill.worker.role)
        if hands_off_kv(role, bool(self._usable((Role.DECODE,), request.model))):
            reply.decode.CopyFrom(
                self._local_decode(scheduler_pb.ChooseDecodeRequest(model=request.model))
            )
        if request.items:
            assign = scheduler_pb.AssignEncodersRequest(
                model=request.model, items=request.items, policy=request.policy
            )
            reply.encoders.CopyFrom(self._local_assignment(assign))
        return reply

    def _local_decode(
        self, request: scheduler_pb.ChooseDecodeRequest
    ) -> scheduler_pb.ChooseDecodeResponse:
        workers = self._usable((Role.DECODE,), request.model, request.exclude_worker_ids)
        if not workers:
            raise _none_left("decode worker", request.model, "NO_DECODE_WORKER")
        return scheduler_pb.ChooseDecodeResponse(worker=self._next("decode", workers))


def _none_left(what: str, model: str, reason: str) -> Unavailable:
    return Unavailable(
        f"no healthy {what} for model {model or '(any)'} in the route's own view "
        "(the scheduler is unreachable)",
        reason=reason,
        metadata={"model": model},
    )
