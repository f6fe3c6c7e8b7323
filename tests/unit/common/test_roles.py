"""The worker role converts to and from ``epd.v1.WorkerRole`` at the gRPC boundary only, and keeps
the spellings users type (``epd prefill --mode``) and read (metrics, ListModels)."""

from __future__ import annotations

import pytest

from epd.common.errors import InvalidArgument
from epd.common.roles import (
    PREFILL_MODES,
    Role,
    known_role,
    role_from_proto,
)
from epd.v1 import scheduler_service_pb2 as scheduler_pb

SET_VALUES = [
    v for v in scheduler_pb.WorkerRole.values() if v != scheduler_pb.WORKER_ROLE_UNSPECIFIED
]


@pytest.mark.parametrize("value", SET_VALUES)
def test_every_proto_role_round_trips_under_its_own_name(value: int) -> None:
    role = role_from_proto(value)
    assert role.value == value
    assert scheduler_pb.WorkerRole.Name(value) == f"WORKER_ROLE_{role.name}"


def test_every_role_has_a_proto_value() -> None:
    assert sorted(role.value for role in Role) == sorted(SET_VALUES)


@pytest.mark.parametrize("value", [scheduler_pb.WORKER_ROLE_UNSPECIFIED, 99, -1])
def test_unspecified_and_unknown_values_are_rejected(value: int) -> None:
    assert known_role(value) is None
    with pytest.raises(InvalidArgument) as caught:
        role_from_proto(value)
    assert caught.value.reason == "BAD_ROLE"
    assert str(caught.value) == (
        "worker role must be set (encode, prefill, decode, prefill_decode or encode_prefill)"
    )


def test_labels_are_the_spellings_users_type_and_read() -> None:
    assert [role.label for role in Role] == [
        "encode",
        "prefill",
        "decode",
        "prefill_decode",
        "encode_prefill",
    ]
    assert [mode.label for mode in PREFILL_MODES] == ["prefill", "prefill_decode", "encode_prefill"]
