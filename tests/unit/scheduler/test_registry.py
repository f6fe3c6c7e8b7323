"""Registry: validation, leases, eviction and re-registration on a fake clock."""

from __future__ import annotations

import pytest

from epd.common.errors import AlreadyExists, InvalidArgument, NotFound
from epd.common.roles import Role
from epd.scheduler.model import Load
from epd.scheduler.registry import Registry
from tests.unit.scheduler.factories import FakeClock, spec


@pytest.mark.parametrize(
    "bad, reason",
    [
        (spec("").__class__("", Role.ENCODE, "h:1", "m"), "BAD_WORKER_ID"),
        (spec("a", weight=0), "BAD_WEIGHT"),
        (spec("a", weight=-2), "BAD_WEIGHT"),
        (spec("a", model=""), "BAD_MODEL"),
        (spec("a", capacity=0), "BAD_CAPACITY"),
        (spec("a").__class__("a", Role.ENCODE, "no-port", "m"), "BAD_ENDPOINT"),
        (spec("a").__class__("a", Role.ENCODE, "host:99999", "m"), "BAD_ENDPOINT"),
        (spec("a").__class__("a", Role.ENCODE, ":80", "m"), "BAD_ENDPOINT"),
    ],
)
def test_bad_registrations_are_invalid_argument(bad, reason: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        Registry().register(bad)
    assert caught.value.reason == reason


def test_duplicate_id_at_another_endpoint_is_refused_while_live() -> None:
    clock = FakeClock()
    registry = Registry(ttl_s=5, clock=clock)
    registry.register(spec("enc", port=7001))
    with pytest.raises(AlreadyExists):
        registry.register(spec("enc", port=7002))
    clock.now += 6
    assert registry.register(spec("enc", port=7002)).spec.endpoint.endswith(":7002")


def test_same_endpoint_re_registration_replaces_the_lease() -> None:
    registry = Registry()
    first = registry.register(spec("enc", port=7001))
    second = registry.register(spec("enc", port=7001))
    assert first.lease_id != second.lease_id
    with pytest.raises(NotFound):
        registry.heartbeat(first.lease_id)
    registry.heartbeat(second.lease_id)


def test_missing_heartbeats_evict_and_the_worker_re_registers() -> None:
    clock = FakeClock()
    registry = Registry(ttl_s=3, clock=clock)
    worker = registry.register(spec("enc"))
    clock.now += 2
    registry.heartbeat(worker.lease_id, Load(queue_depth=4))
    clock.now += 2.5
    assert [w.id for w in registry.live([Role.ENCODE])] == ["enc"]
    assert registry.get("enc").load.queue_depth == 4  # type: ignore[union-attr]
    clock.now += 1
    assert registry.live([Role.ENCODE]) == []
    with pytest.raises(NotFound) as caught:
        registry.heartbeat(worker.lease_id)
    assert caught.value.reason == "LEASE_NOT_FOUND"
    registry.register(spec("enc"))
    assert [w.id for w in registry.live([Role.ENCODE])] == ["enc"]


def test_live_filters_role_model_and_exclusions() -> None:
    registry = Registry()
    for worker_spec in (
        spec("e1"),
        spec("e2", model="other"),
        spec("p1", Role.PREFILL),
        spec("e3"),
    ):
        registry.register(worker_spec)
    assert [w.id for w in registry.live([Role.ENCODE], "m")] == ["e1", "e3"]
    assert [w.id for w in registry.live([Role.ENCODE], "m", exclude=["e1"])] == ["e3"]
    assert [w.id for w in registry.live([Role.ENCODE])] == ["e1", "e2", "e3"]
    assert registry.models() == ["m", "other"]


def test_deregister_is_idempotent() -> None:
    registry = Registry()
    worker = registry.register(spec("enc"))
    assert registry.deregister(worker.lease_id) is not None
    assert registry.deregister(worker.lease_id) is None
    assert registry.all() == []
