"""NIXL handoffs between two real processes (UCX, host memory), each ending with a leak check:
no payload held, no receive block in use in the consumer, no NIXL region left registered here
once the plane is closed, no new /dev/shm entries."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
import torch

from epd.server.transfer import nixl_agent, shm
from epd.server.transfer.plane import DataPlane
from epd.v1 import tensor_pb2
from tests.integration.transfer.peers import (
    HOST,
    Peer,
    digest,
    make_tensor,
    put_concurrently,
    reference_of_a_killed_producer,
)

pytestmark = pytest.mark.skipif(not nixl_agent.is_available(), reason="nixl is not installed")

KiB, MiB = 1 << 10, 1 << 20
REMOTE = "remote-host"
NIXL = tensor_pb2.TRANSFER_KIND_NIXL


def wait_until_nothing_held(plane: DataPlane, timeout_s: float = 5.0) -> None:
    """Poll until the producer has freed everything (notifications arrive asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while plane.held() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert plane.held() == []


@pytest.fixture(scope="module")
def peer() -> Iterator[Peer]:
    """A consumer on another host; at the end it must deregister everything it registered."""
    consumer_peer = Peer(REMOTE)
    yield consumer_peer
    assert consumer_peer.ask("close") == 0
    consumer_peer.stop()


def shm_entries_of(*pids: int) -> set[str]:
    """/dev/shm entries that name one of ``pids`` (epd segments carry their creator's pid);
    entries of other processes on this shared machine are not this test's business."""
    return {
        name
        for name in os.listdir("/dev/shm")
        if any(f"-{pid}-" in name or name.endswith(f"-{pid}") for pid in pids)
    }


@pytest.fixture
def new_plane(peer: Peer) -> Iterator[list[DataPlane]]:
    """Makes producer planes; checks every leak once the test is done with them."""
    pids = (os.getpid(), peer.process.pid or 0)
    shm_before = shm_entries_of(*pids)
    planes: list[DataPlane] = []
    yield planes
    for plane in planes:
        wait_until_nothing_held(plane)
        plane.close()
    assert nixl_agent.num_registered_regions() == 0
    assert peer.ask("outstanding") == 0
    assert shm_entries_of(*pids) <= shm_before


@pytest.fixture
def plane(new_plane: list[DataPlane]) -> DataPlane:
    new_plane.append(DataPlane(HOST, producer_endpoint="127.0.0.1:1"))
    return new_plane[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_bytes", [1 * KiB, 1 * MiB, 16 * MiB])
def test_nixl_round_trip_released_by_notification(
    plane: DataPlane, peer: Peer, dtype: torch.dtype, num_bytes: int
) -> None:
    tensor = make_tensor(dtype, num_bytes, seed=num_bytes)
    ref = plane.put(tensor, REMOTE)
    assert ref.WhichOneof("location") == "nixl" and ref.producer_endpoint == "127.0.0.1:1"
    assert all(d.address and d.length for d in ref.nixl.descriptors)
    assert peer.read(ref) == ("ok", digest(tensor), list(tensor.shape), str(dtype))
    wait_until_nothing_held(plane)
    assert plane.release([ref.lease_id]) == 0


def test_nixl_round_trip_128_mib(plane: DataPlane, peer: Peer) -> None:
    tensor = make_tensor(torch.bfloat16, 128 * MiB, seed=1)
    ref = plane.put(tensor, REMOTE, preferred=NIXL)
    assert peer.read(ref)[1] == digest(tensor)


def test_release_rpc_before_the_read_makes_the_reference_dangling(
    plane: DataPlane, peer: Peer
) -> None:
    first = plane.put(make_tensor(torch.float32, 8 * KiB, seed=6), REMOTE)
    assert plane.release([first.lease_id]) == 1
    second = plane.put(make_tensor(torch.float32, 8 * KiB, seed=7), REMOTE)
    assert second.nixl.descriptors[0].address == first.nixl.descriptors[0].address
    assert peer.read(first) == ("error", "LEASE_RELEASED", "NotFound")
    assert peer.read(second)[0] == "ok"


def test_many_concurrent_transfers_reuse_registered_blocks(plane: DataPlane, peer: Peer) -> None:
    tensors = [make_tensor(torch.float16, 256 * KiB, seed=i) for i in range(32)]
    refs = put_concurrently(plane, tensors, REMOTE)
    for tensor, ref in zip(tensors, refs, strict=True):
        assert peer.read(ref)[1] == digest(tensor)
    wait_until_nothing_held(plane)
    registered = nixl_agent.num_registered_regions()  # NOTE: each block is one region
    assert registered <= len(tensors)
    for i in range(10):
        assert peer.read(plane.put(tensors[i], REMOTE))[1] == digest(tensors[i])
        wait_until_nothing_held(plane)
    assert nixl_agent.num_registered_regions() == registered


def test_expired_lease_is_refused_and_reaped(new_plane: list[DataPlane], peer: Peer) -> None:
    plane = DataPlane(HOST, lease_ttl_s=0.2)
    new_plane.append(plane)
    ref = plane.put(make_tensor(torch.float32, 8 * KiB, seed=5), REMOTE)
    time.sleep(0.3)
    assert peer.read(ref) == ("error", "LEASE_EXPIRED", "NotFound")
    assert plane.reap_expired() == 1 and plane.held() == []


def test_bad_references_raise_typed_errors(plane: DataPlane, peer: Peer) -> None:
    ref = plane.put(make_tensor(torch.float32, 4 * KiB, seed=9), REMOTE)

    def altered(**changes: object) -> tensor_pb2.TensorRef:
        bad = tensor_pb2.TensorRef()
        bad.CopyFrom(ref)
        for path, value in changes.items():
            # NOTE: a pooled payload has one descriptor, its stamp and payload (the last one).
            if path == "payload_length":
                bad.nixl.descriptors[-1].length = value  # type: ignore[assignment]
            elif path == "payload_address":
                bad.nixl.descriptors[-1].address = value  # type: ignore[assignment]
            elif path in ("agent_name", "agent_metadata"):
                setattr(bad.nixl, path, value)
            else:
                setattr(bad, path, value)
        return bad

    assert peer.read(altered(payload_length=8 * KiB)) == (
        "error",
        "TENSOR_SIZE_MISMATCH",
        "InvalidArgument",
    )
    assert peer.read(altered(dtype=tensor_pb2.SCALAR_TYPE_FLOAT16)) == (
        "error",
        "TENSOR_SIZE_MISMATCH",
        "InvalidArgument",
    )
    assert peer.read(altered(agent_name="epd-nobody", agent_metadata=b"")) == (
        "error",
        "NIXL_AGENT_UNKNOWN",
        "NotFound",
    )
    assert peer.read(altered(agent_metadata=b"not metadata")) == (
        "error",
        "NIXL_BAD_METADATA",
        "InvalidArgument",
    )
    assert peer.read(altered(payload_address=4096)) == (
        "error",
        "NIXL_REGION_NOT_FOUND",
        "NotFound",
    )
    assert peer.read(ref)[0] == "ok"


# NOTE: long enough that a loaded machine's kill and join do not expire it before the check
# (1 s did once in a whole suite, and 3 s once more); the reaper frees it once it expires.
NEVER_READ_TTL_S = 10.0


def test_consumer_killed_mid_way_leaks_nothing(new_plane: list[DataPlane]) -> None:
    plane = DataPlane(HOST, lease_ttl_s=1.0)
    new_plane.append(plane)
    victim = Peer(REMOTE)
    try:
        warm_up = plane.put(make_tensor(torch.float32, 1 * KiB, seed=8), REMOTE, ttl_s=120)
        assert victim.read(warm_up)[0] == "ok"  # the victim's agent exists, its imports are done
        plane.start_reaper(interval_s=0.05)
        viewed = plane.put(make_tensor(torch.float32, 4 * MiB, seed=8), REMOTE)
        assert victim.read(viewed, hold=True)[0] == "ok"
        never_read = plane.put(
            make_tensor(torch.float32, 4 * MiB, seed=9), REMOTE, ttl_s=NEVER_READ_TTL_S
        )
        os.kill(victim.process.pid, signal.SIGKILL)
        victim.process.join(10)
        deadline = time.monotonic() + 0.5
        while len(plane.held()) > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [info.lease_id for info in plane.held()] == [never_read.lease_id]
        wait_until_nothing_held(plane, timeout_s=NEVER_READ_TTL_S + 5)
    finally:
        victim.stop()


def test_producer_killed_gives_a_typed_error_and_leaves_nothing(
    new_plane: list[DataPlane], peer: Peer
) -> None:
    shm_before = set(shm.list_segments())
    data = reference_of_a_killed_producer(HOST, REMOTE)
    answer = peer.ask((data, False, False), timeout_s=60)
    assert answer in (
        ("error", "NIXL_PEER_UNREACHABLE", "Unavailable"),
        ("error", "NIXL_REGION_NOT_FOUND", "NotFound"),
    ), answer
    assert set(shm.list_segments()) <= shm_before


def test_large_tensors_are_lent_in_place_not_copied(plane: DataPlane, peer: Peer) -> None:
    tensor = make_tensor(torch.float32, 4 * MiB, seed=21)
    ref = plane.put(tensor, REMOTE)
    assert ref.nixl.descriptors[1].address == tensor.data_ptr()  # the caller's memory
    twice = plane.put(tensor, REMOTE)  # the same memory lent twice is registered once
    assert nixl_agent.num_registered_regions() == 2  # the stamp arena and the tensor: no block
    assert peer.read(ref)[1] == digest(tensor) and peer.read(twice)[1] == digest(tensor)
    wait_until_nothing_held(plane)
    assert nixl_agent.num_registered_regions() == 1  # only the stamp arena is left


def test_a_released_lent_reference_is_refused(plane: DataPlane, peer: Peer) -> None:
    first = plane.put(make_tensor(torch.float32, 2 * MiB, seed=22), REMOTE)
    assert plane.release([first.lease_id]) == 1
    second = plane.put(make_tensor(torch.float32, 2 * MiB, seed=23), REMOTE)
    assert second.nixl.descriptors[0].address == first.nixl.descriptors[0].address  # stamp slot
    assert peer.read(first) == ("error", "LEASE_RELEASED", "NotFound")
    assert peer.read(second)[0] == "ok"


def test_a_lent_tensor_inside_a_region_lent_before_is_read(plane: DataPlane, peer: Peer) -> None:
    """The consumer's NIXL keeps a record of every region it ever loaded, also once the producer
    deregistered it: a READ of a region that starts before such a record must find its own."""
    buffer = make_tensor(torch.float32, 24 * MiB, seed=41).reshape(-1)
    inner = buffer[MiB : MiB + MiB // 2]  # 2 MiB lent from 4 MiB into the buffer
    first = plane.put(inner, REMOTE, preferred=NIXL)
    assert first.nixl.descriptors[1].address == inner.data_ptr()
    assert peer.read(first)[1] == digest(inner)
    assert plane.release([first.lease_id]) in (0, 1)
    whole = plane.put(buffer, REMOTE, preferred=NIXL)
    assert whole.nixl.descriptors[1].address == buffer.data_ptr()
    assert peer.read(whole)[1] == digest(buffer)


def test_reads_from_many_threads_at_once(plane: DataPlane, peer: Peer) -> None:
    """Four consumer threads read at once, lent and pooled payloads, beside the polling thread."""
    tensors = [
        make_tensor(torch.float16, size, seed=50 + i)
        for i, size in enumerate([3 * MiB, 16 * KiB, 2 * MiB + 4096, 64 * KiB] * 2)
    ]
    refs = [plane.put(tensor, REMOTE, preferred=NIXL) for tensor in tensors]
    answers = peer.ask([ref.SerializeToString() for ref in refs[:4]])
    answers += peer.ask([ref.SerializeToString() for ref in refs[4:]])
    assert [answer[1] for answer in answers] == [digest(tensor) for tensor in tensors]
