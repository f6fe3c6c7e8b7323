"""Shared-memory and inline handoffs between two real processes, each ending with a leak check."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
import torch

from epd.server.transfer import shm
from epd.server.transfer.plane import DataPlane
from tests.integration.transfer.peers import (
    HOST,
    SPAWN,
    Peer,
    digest,
    make_tensor,
    producer,
    put_concurrently,
)

KiB, MiB = 1 << 10, 1 << 20
# NOTE: without nixl, a consumer on another host gets inline (what these tests are about).
NO_NIXL = ("shm", "inline")


@pytest.fixture
def no_leaks() -> Iterator[None]:
    """Fails the test if this process keeps segments it did not have before, or if processes of
    the test died leaving segments behind. Other processes' live segments are not ours to judge."""
    own = shm.process_prefix()
    before = set(shm.list_segments())
    yield
    shm.cleanup_orphans()
    after = set(shm.list_segments())
    assert {name for name in after - before if name.startswith(own)} == set()


@pytest.fixture(scope="module")
def peer() -> Iterator[Peer]:
    consumer_peer = Peer()
    yield consumer_peer
    consumer_peer.stop()


@pytest.fixture
def plane(no_leaks: None) -> Iterator[DataPlane]:
    data_plane = DataPlane(HOST, producer_endpoint="127.0.0.1:1", kinds=NO_NIXL)
    yield data_plane
    assert data_plane.held() == []
    data_plane.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_bytes", [1 * KiB, 1 * MiB, 16 * MiB])
def test_shm_round_trip(plane: DataPlane, peer: Peer, dtype: torch.dtype, num_bytes: int) -> None:
    tensor = make_tensor(dtype, num_bytes, seed=num_bytes)
    ref = plane.put(tensor, HOST)
    assert ref.WhichOneof("location") == "shm" and ref.producer_endpoint == "127.0.0.1:1"
    assert peer.read(ref) == ("ok", digest(tensor), list(tensor.shape), str(dtype))
    assert plane.release([ref.lease_id]) == 1
    assert plane.release([ref.lease_id]) == 0


def test_shm_round_trip_128_mib(plane: DataPlane, peer: Peer) -> None:
    tensor = make_tensor(torch.float32, 128 * MiB, seed=1)
    ref = plane.put(tensor, HOST)
    assert peer.read(ref)[1] == digest(tensor)
    plane.release([ref.lease_id])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_inline_round_trip_to_another_host(plane: DataPlane, dtype: torch.dtype) -> None:
    remote = Peer("other-host")
    try:
        tensor = make_tensor(dtype, 64 * KiB, seed=3)
        ref = plane.put(tensor, "other-host")
        assert ref.WhichOneof("location") == "inline_data" and not ref.lease_id
        assert remote.read(ref) == ("ok", digest(tensor), list(tensor.shape), str(dtype))
    finally:
        remote.stop()


def test_shm_reference_is_refused_on_another_host(plane: DataPlane) -> None:
    remote = Peer("other-host")
    try:
        ref = plane.put(make_tensor(torch.float32, 4 * KiB, seed=4), HOST)
        assert remote.read(ref) == ("error", "FOREIGN_HOST", "FailedPrecondition")
        plane.release([ref.lease_id])
    finally:
        remote.stop()


def test_many_concurrent_transfers_reuse_the_pool(plane: DataPlane, peer: Peer) -> None:
    tensors = [make_tensor(torch.float16, 256 * KiB, seed=i) for i in range(32)]
    refs = put_concurrently(plane, tensors, HOST)
    for tensor, ref in zip(tensors, refs, strict=True):
        assert peer.read(ref)[1] == digest(tensor)
    assert plane.release([ref.lease_id for ref in refs]) == len(tensors)
    segments = {ref.shm.name for ref in refs}
    for i in range(10):
        ref = plane.put(tensors[i], HOST)
        assert ref.shm.name in segments  # NOTE: a pooled segment, none created
        plane.release([ref.lease_id])


def test_expired_lease_is_refused_and_reaped(no_leaks: None, peer: Peer) -> None:
    plane = DataPlane(HOST, lease_ttl_s=0.2, kinds=NO_NIXL)
    ref = plane.put(make_tensor(torch.float32, 8 * KiB, seed=5), HOST)
    time.sleep(0.3)
    assert peer.read(ref) == ("error", "LEASE_EXPIRED", "NotFound")
    assert plane.reap_expired() == 1 and plane.held() == []
    plane.close()


def test_released_lease_is_not_readable_even_after_segment_reuse(
    plane: DataPlane, peer: Peer
) -> None:
    first = plane.put(make_tensor(torch.float32, 8 * KiB, seed=6), HOST)
    plane.release([first.lease_id])
    second = plane.put(make_tensor(torch.float32, 8 * KiB, seed=7), HOST)
    assert second.shm.name == first.shm.name
    assert peer.read(first) == ("error", "LEASE_RELEASED", "NotFound")
    plane.release([second.lease_id])


@pytest.mark.parametrize("copy", [False, True])
def test_a_segment_serving_lease_after_lease_reads_right_in_the_consumer(
    plane: DataPlane, peer: Peer, copy: bool
) -> None:
    """The consumer keeps its mapping of the segment from one lease to the next (views from a
    private mapping, copies from a shared one): every lease reads its own bytes, also while the
    consumer still holds a view of an earlier one, and a released lease is refused."""
    previous = None
    for seed in range(6):
        tensor = make_tensor(torch.bfloat16, 1 * MiB, seed=100 + seed)
        ref = plane.put(tensor, HOST)
        assert previous is None or ref.shm.name == previous.shm.name
        assert peer.read(ref, hold=seed == 2, copy=copy) == (
            "ok",
            digest(tensor),
            list(tensor.shape),
            str(torch.bfloat16),
        )
        if previous is not None:
            assert peer.read(previous, copy=copy) == ("error", "LEASE_RELEASED", "NotFound")
        plane.release([ref.lease_id])
        previous = ref


def test_consumer_killed_mid_way_leaks_nothing(no_leaks: None) -> None:
    plane = DataPlane(HOST, lease_ttl_s=1.0, kinds=NO_NIXL)
    victim = Peer()
    warm_up = plane.put(make_tensor(torch.float32, 1 * KiB, seed=8), "elsewhere")
    assert victim.read(warm_up)[0] == "ok"
    plane.start_reaper(interval_s=0.05)
    ref = plane.put(make_tensor(torch.float32, 4 * MiB, seed=8), HOST)
    assert victim.read(ref, hold=True)[0] == "ok"
    os.kill(victim.process.pid, signal.SIGKILL)
    victim.process.join(10)
    deadline = time.monotonic() + 5
    while plane.held() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert plane.held() == []
    plane.close()


def test_producer_killed_leaves_orphans_that_the_next_producer_removes(no_leaks: None) -> None:
    conn, child_conn = SPAWN.Pipe()
    process = SPAWN.Process(target=producer, args=(child_conn, HOST), daemon=True)
    process.start()
    assert conn.poll(120)
    _, segment_name, pid = conn.recv()
    assert segment_name in shm.list_segments()
    os.kill(pid, signal.SIGKILL)
    process.join(10)
    assert segment_name in shm.list_segments()
    plane = DataPlane(HOST, kinds=NO_NIXL)
    assert segment_name not in shm.list_segments()
    plane.close()


def test_a_live_producers_reaper_removes_a_killed_producers_segments(no_leaks: None) -> None:
    plane = DataPlane(HOST, kinds=NO_NIXL)
    plane.start_reaper(interval_s=0.05, orphan_interval_s=0.05)
    conn, child_conn = SPAWN.Pipe()
    process = SPAWN.Process(target=producer, args=(child_conn, HOST), daemon=True)
    process.start()
    assert conn.poll(120)
    _, segment_name, pid = conn.recv()
    os.kill(pid, signal.SIGKILL)  # NOTE: not joined: the segments of a zombie are orphans too
    deadline = time.monotonic() + 10
    while segment_name in shm.list_segments() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert segment_name not in shm.list_segments()
    process.join(10)
    plane.close()
