"""The route keeps routing from the scheduler's last listing while the scheduler is unreachable:
live healthy workers, exclusions honoured, for at most ``fallback_s``; it goes back to the
scheduler once the scheduler lists the workers again. Against in-memory fakes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from epd.common.errors import NotFound, Unavailable
from epd.common.roles import Role
from epd.server.route.encoding import encode_all
from epd.server.route.metrics import RouteMetrics
from epd.server.route.request import Deadline
from epd.server.route.scheduler_fallback import REJOIN_GRACE_S, FallbackScheduler
from epd.v1 import scheduler_service_pb2 as scheduler_pb
from tests.unit.route.fake_scheduler import FakeScheduler
from tests.unit.route.fakes import FakePeers, generate, text_router
from tests.unit.route.test_orchestration import stage_of

FALLBACK_S = 60.0


@dataclass
class DownableScheduler:
    """The fake scheduler, or an unreachable one (every call Unavailable, no reason of its
    own) while ``is_down``."""

    scheduler: FakeScheduler = field(default_factory=FakeScheduler)
    is_down: bool = False
    num_calls: int = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.scheduler, name)

        async def call(request: Any, timeout: float | None = None) -> Any:
            self.num_calls += 1
            if self.is_down:
                raise Unavailable("failed to connect to all addresses")
            return await method(request, timeout)

        return call


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Health:
    """Health checks: SERVING unless the endpoint is in ``failing``."""

    failing: set[str] = field(default_factory=set)
    checked: list[str] = field(default_factory=list)

    async def __call__(self, endpoint: str) -> bool:
        self.checked.append(endpoint)
        return endpoint not in self.failing


@dataclass
class Setup:
    remote: DownableScheduler
    fallback: FallbackScheduler
    peers: FakePeers
    clock: Clock
    health: Health


async def setup(
    prefills: list[str] | None = None, fallback_s: float = FALLBACK_S, listed: bool = True
) -> Setup:
    """A fallback over a reachable fake scheduler that has listed its workers once (pd0, pd1,
    enc0, enc1, dec0 of model tiny)."""
    fake = FakeScheduler(prefills=[(w, Role.PREFILL_DECODE) for w in prefills or ["pd0", "pd1"]])
    remote, clock, health = DownableScheduler(fake), Clock(), Health()
    metrics = RouteMetrics(CollectorRegistry())
    fallback = FallbackScheduler(remote, health, fallback_s, metrics=metrics, clock=clock)
    if listed:
        await fallback.refresh()
    return Setup(remote, fallback, FakePeers(scheduler=fallback), clock, health)  # type: ignore[arg-type]


def choose(
    exclude: tuple[str, ...] = (),
    roles: tuple[int, ...] = (scheduler_pb.WORKER_ROLE_PREFILL_DECODE,),
) -> scheduler_pb.ChoosePrefillRequest:
    return scheduler_pb.ChoosePrefillRequest(
        model="tiny",
        exclude_worker_ids=exclude,
        roles=roles,  # type: ignore[arg-type]
    )


async def test_requests_are_served_on_the_listed_workers_in_turn_while_it_is_down() -> None:
    s = await setup()
    worker = text_router(s.peers)
    s.remote.is_down = True
    answers = [await generate(worker, "tiny") for _ in range(4)]
    assert all([t for c in a for t in c.token_ids] == [7, 8, 9] for a in answers)
    assert s.fallback.is_degraded and s.fallback.num_local_choices == 4
    assert len(s.peers.engines["pd0"].calls) == len(s.peers.engines["pd1"].calls) == 2
    metrics = s.fallback._metrics
    assert metrics is not None and metrics.scheduler_fallback._value.get() == 1
    assert metrics.locally_routed._value.get() == 4


async def test_exclusions_roles_and_models_are_honoured() -> None:
    s = await setup()
    s.remote.is_down = True
    choices = [await s.fallback.ChoosePrefill(choose(exclude=("pd0",))) for _ in range(3)]
    assert {c.worker.id for c in choices} == {"pd1"}
    assert choices[0].worker.endpoint == "pd1" and choices[0].worker.model == "tiny"
    with pytest.raises(Unavailable) as caught:
        await s.fallback.ChoosePrefill(choose(exclude=("pd0", "pd1")))
    assert caught.value.reason == "NO_PREFILL_WORKER"
    with pytest.raises(Unavailable):
        await s.fallback.ChoosePrefill(choose(roles=(scheduler_pb.WORKER_ROLE_PREFILL,)))
    other = scheduler_pb.ChoosePrefillRequest(
        model="other", roles=[scheduler_pb.WORKER_ROLE_PREFILL_DECODE]
    )
    with pytest.raises(Unavailable):
        await s.fallback.ChoosePrefill(other)
    decode = await s.fallback.ChooseDecode(scheduler_pb.ChooseDecodeRequest(model="tiny"))
    assert decode.worker.id == "dec0"


async def test_images_are_spread_over_the_encoders_and_reports_are_dropped() -> None:
    s = await setup()
    s.remote.is_down = True
    items = [scheduler_pb.EncodeItem(mm_hash=f"h{i}") for i in range(4)]
    request = scheduler_pb.AssignEncodersRequest(model="tiny", items=items)
    assignment = await s.fallback.AssignEncoders(request)
    assert [a.worker_id for a in assignment.assignments] == ["enc0", "enc1", "enc0", "enc1"]
    assert [a.item_index for a in assignment.assignments] == [0, 1, 2, 3]
    request.exclude_worker_ids.append("enc0")
    again = await s.fallback.AssignEncoders(request)
    assert {a.endpoint for a in again.assignments} == {"enc1"}
    num_calls = s.remote.num_calls
    report = scheduler_pb.CompleteEncodingRequest(assignment_id=assignment.assignment_id)
    await s.fallback.CompleteEncoding(report)
    assert s.remote.num_calls == num_calls
    s.remote.is_down = False
    await s.fallback.refresh()
    await s.fallback.CompleteEncoding(report)  # NOTE: made locally: never reaches the scheduler
    assert not [c for c in s.remote.scheduler.calls if c[0] == "CompleteEncoding"]


async def test_a_request_is_placed_from_the_view_as_the_scheduler_would() -> None:
    s = await setup()
    s.remote.is_down = True
    items = [scheduler_pb.EncodeItem(mm_hash=f"h{i}") for i in range(2)]
    roles = [scheduler_pb.WORKER_ROLE_PREFILL_DECODE]
    placed = await s.fallback.Place(
        scheduler_pb.PlaceRequest(model="tiny", items=items, prefill_roles=roles)
    )
    assert placed.prefill.worker.id in ("pd0", "pd1")
    assert not placed.HasField("decode"), "a prefill_decode worker decodes itself"
    assert [a.worker_id for a in placed.encoders.assignments] == ["enc0", "enc1"]
    assert placed.encoders.assignment_id.startswith("local-")
    text_only = await s.fallback.Place(scheduler_pb.PlaceRequest(model="tiny"))
    assert not text_only.HasField("encoders")


async def test_images_are_encoded_without_the_scheduler() -> None:
    s = await setup()
    s.remote.is_down = True
    stage = stage_of(2)
    await encode_all(s.peers, stage, Deadline(30))  # type: ignore[arg-type]
    await s.peers.background.settle()
    assert sorted(stage.results) == [0, 1] and stage.encoder_ids == {"enc0", "enc1"}
    assert s.fallback.is_degraded and not s.remote.scheduler.calls[1:]


async def test_the_view_is_not_served_past_the_staleness_bound() -> None:
    s = await setup()
    worker = text_router(s.peers)
    s.remote.is_down = True
    await generate(worker, "tiny")
    s.clock.now += FALLBACK_S + 1
    with pytest.raises(Unavailable) as caught:
        await s.fallback.ChoosePrefill(choose())
    assert caught.value.reason == "UNAVAILABLE"
    with pytest.raises(Unavailable):
        await s.fallback.ListWorkers(scheduler_pb.ListWorkersRequest())


async def test_without_a_listing_or_with_fallback_off_calls_fail_as_the_schedulers_do() -> None:
    never = await setup(listed=False)
    never.remote.is_down = True
    await never.fallback.refresh()
    assert not never.fallback.is_degraded
    with pytest.raises(Unavailable):
        await never.fallback.ChoosePrefill(choose())
    off = await setup(fallback_s=0)
    off.clock.now += 0.5
    off.remote.is_down = True
    with pytest.raises(Unavailable):
        await off.fallback.ChoosePrefill(choose())


async def test_the_schedulers_own_answers_are_not_second_guessed() -> None:
    s = await setup()
    with pytest.raises(Unavailable) as caught:
        await s.fallback.ChoosePrefill(choose(exclude=("pd0", "pd1")))
    assert caught.value.reason == "NO_WORKER" and not s.fallback.is_degraded
    s.remote.scheduler.ChooseDecode = _raise_not_found  # type: ignore[method-assign]
    with pytest.raises(NotFound):
        await s.fallback.ChooseDecode(scheduler_pb.ChooseDecodeRequest(model="tiny"))


async def _raise_not_found(request: Any, timeout: float | None = None) -> Any:
    raise NotFound("no such model", reason="MODEL_NOT_FOUND")


async def test_workers_failing_their_health_check_are_dropped_and_return_when_healthy() -> None:
    s = await setup()
    s.remote.is_down = True
    await s.fallback.refresh()
    assert s.fallback.is_degraded and set(s.health.checked) >= {"pd0", "pd1", "enc0"}
    s.health.failing = {"pd0"}
    await s.fallback.refresh()
    choices = {(await s.fallback.ChoosePrefill(choose())).worker.id for _ in range(4)}
    assert choices == {"pd1"}
    listed = await s.fallback.ListWorkers(scheduler_pb.ListWorkersRequest())
    assert "pd0" not in {w.info.id for w in listed.workers}
    s.health.failing = set()
    await s.fallback.refresh()
    choices = {(await s.fallback.ChoosePrefill(choose())).worker.id for _ in range(4)}
    assert choices == {"pd0", "pd1"}


async def test_it_goes_back_to_the_scheduler_once_the_workers_are_listed_again() -> None:
    s = await setup()
    s.remote.is_down = True
    await s.fallback.refresh()
    fake = s.remote.scheduler
    saved = fake.prefills, fake.encoders, fake.decoders
    fake.prefills, fake.encoders, fake.decoders = [], [], []  # NOTE: restarted, none registered
    s.remote.is_down = False
    await s.fallback.refresh()
    assert s.fallback.is_degraded  # its listing lacks the healthy workers
    assert (await s.fallback.ChoosePrefill(choose())).worker.id in {"pd0", "pd1"}
    fake.prefills, fake.encoders, fake.decoders = saved
    await s.fallback.refresh()
    assert not s.fallback.is_degraded
    num_choices = s.fallback.num_local_choices
    await s.fallback.ChoosePrefill(choose())
    assert s.fallback.num_local_choices == num_choices
    assert fake.calls[-1][0] == "ChoosePrefill"
    metrics = s.fallback._metrics
    assert metrics is not None and metrics.scheduler_fallback._value.get() == 0


async def test_a_worker_never_registering_again_holds_the_route_back_only_for_the_grace() -> None:
    s = await setup()
    s.remote.is_down = True
    await s.fallback.refresh()
    s.remote.scheduler.prefills = [("pd1", Role.PREFILL_DECODE)]  # pd0 healthy but not registered
    s.remote.is_down = False
    await s.fallback.refresh()
    assert s.fallback.is_degraded
    s.clock.now += REJOIN_GRACE_S
    await s.fallback.refresh()
    assert not s.fallback.is_degraded
