"""WorkerInfo <-> WorkerSpec: every field survives the round trip; empty fields take defaults."""

from __future__ import annotations

from dataclasses import fields

from epd.common.roles import Role
from epd.scheduler.convert import spec_from_proto, spec_to_proto
from epd.scheduler.model import WorkerSpec
from epd.v1 import scheduler_service_pb2 as pb


def test_a_registration_survives_the_round_trip() -> None:
    spec = WorkerSpec(
        "p0",
        Role.PREFILL,
        "10.0.0.2:7001",
        "tiny",
        device="cuda:1",
        weight=2.5,
        capacity=8,
        host_id="host-b",
        embeddings_device="cuda:1",
    )
    assert spec_from_proto(spec_to_proto(spec)) == spec
    defaults = WorkerSpec("x", Role.ENCODE, "", "")
    # NOTE: a field added to WorkerSpec must be set above, or its conversion goes untested.
    assert all(getattr(spec, f.name) != getattr(defaults, f.name) for f in fields(WorkerSpec))


def test_empty_fields_take_their_defaults() -> None:
    info = pb.WorkerInfo(id="e0", role=pb.WORKER_ROLE_ENCODE, endpoint="10.0.0.1:7000", model="m")
    spec = spec_from_proto(info)
    assert (spec.device, spec.capacity, spec.embeddings_device) == ("cpu", 1, "cpu")
