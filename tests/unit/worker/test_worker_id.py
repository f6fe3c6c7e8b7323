"""The id a worker registers under unless ``--worker-id`` names it: one format for every role."""

from __future__ import annotations

import pytest

from epd.common.roles import Role
from epd.server.worker.serve_worker import worker_id


@pytest.mark.parametrize(
    ("role", "expected"),
    [
        (Role.ENCODE, "encode-node1-50061"),
        (Role.PREFILL, "prefill-node1-50061"),
        (Role.DECODE, "decode-node1-50061"),
        (Role.PREFILL_DECODE, "prefill_decode-node1-50061"),
        (Role.ENCODE_PREFILL, "encode_prefill-node1-50061"),
    ],
)
def test_a_worker_is_named_after_its_role_host_and_port(role: Role, expected: str) -> None:
    assert worker_id(role, "node1", 50061) == expected
