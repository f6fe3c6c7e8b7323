"""Striped NIXL READs between two real processes: a consumer whose agent stripes every READ
($EPD_NIXL_STRIPE_MIN_BYTES=1) reads payloads of every dtype and of sizes that do not fall on page
boundaries, pooled and lent, byte for byte; a dead producer gives a typed error and the readers
go on serving. Each test ends with the leak checks of the other NIXL tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from epd.server.transfer import nixl_agent
from epd.server.transfer.plane import DataPlane
from epd.v1 import tensor_pb2
from tests.integration.transfer.peers import (
    HOST,
    Peer,
    digest,
    make_tensor,
    reference_of_a_killed_producer,
)

pytestmark = pytest.mark.skipif(not nixl_agent.is_available(), reason="nixl is not installed")

KiB, MiB = 1 << 10, 1 << 20
REMOTE = "remote-host"
NIXL = tensor_pb2.TRANSFER_KIND_NIXL


@pytest.fixture(scope="module")
def striping_peer() -> Iterator[Peer]:
    """A consumer on another host that cuts every READ in two; it must end with nothing
    registered and no prepared READ kept."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EPD_NIXL_STRIPE_MIN_BYTES", "1")
        consumer_peer = Peer(REMOTE)
        assert consumer_peer.ask("stripes") == 2
    yield consumer_peer
    assert consumer_peer.ask("close") == (0, 0)
    consumer_peer.stop()


@pytest.fixture
def plane(striping_peer: Peer) -> Iterator[DataPlane]:
    producer_plane = DataPlane(HOST)
    yield producer_plane
    producer_plane.close()
    assert nixl_agent.num_registered_regions() == 0
    assert striping_peer.ask("outstanding") == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("num_bytes", [1 * KiB, 96 * KiB + 512, 1 * MiB, 3 * MiB + 12800])
def test_striped_reads_return_every_byte(plane: DataPlane, striping_peer: Peer,
                                         dtype: torch.dtype, num_bytes: int) -> None:  # fmt: skip
    tensor = make_tensor(dtype, num_bytes, seed=num_bytes + 3)
    ref = plane.put(tensor, REMOTE, preferred=NIXL)
    assert striping_peer.read(ref) == ("ok", digest(tensor), list(tensor.shape), str(dtype))


def test_a_striped_read_from_a_dead_producer_is_a_typed_error(
    plane: DataPlane, striping_peer: Peer
) -> None:
    data = reference_of_a_killed_producer(HOST, REMOTE)
    answer = striping_peer.ask((data, False, False), timeout_s=60)
    assert answer in (("error", "NIXL_PEER_UNREACHABLE", "Unavailable"),
                      ("error", "NIXL_REGION_NOT_FOUND", "NotFound")), answer  # fmt: skip
    tensor = make_tensor(torch.float32, 2 * MiB, seed=31)
    assert striping_peer.read(plane.put(tensor, REMOTE, preferred=NIXL))[1] == digest(tensor)


def test_a_cut_behind_a_stale_registration_record_is_still_read(
    plane: DataPlane, striping_peer: Peer
) -> None:
    """The consumer's NIXL keeps a record of every region it ever loaded, also once the producer
    deregistered it; a part that starts behind such a record must still find its own."""
    buffer = make_tensor(torch.float32, 24 * MiB, seed=41).reshape(-1)
    inner = buffer[MiB : MiB + MiB // 2]  # 2 MiB lent from 4 MiB into the buffer
    first = plane.put(inner, REMOTE, preferred=NIXL)
    assert first.nixl.descriptors[1].address == inner.data_ptr()
    assert striping_peer.read(first)[1] == digest(inner)
    assert plane.release([first.lease_id]) in (0, 1)
    whole = plane.put(buffer, REMOTE, preferred=NIXL)
    assert whole.nixl.descriptors[1].address == buffer.data_ptr()
    assert striping_peer.read(whole)[1] == digest(buffer)


def test_striped_reads_from_many_threads_at_once(plane: DataPlane, striping_peer: Peer) -> None:
    """Four consumer threads read at once: striped READs, small pooled READs and the polling
    thread share the agent (NIXL's reader/writer mode, the poll gate, the readers' queues)."""
    tensors = [make_tensor(torch.float16, size, seed=50 + i)
               for i, size in enumerate([3 * MiB, 16 * KiB, 2 * MiB + 4096, 64 * KiB] * 2)]
    refs = [plane.put(tensor, REMOTE, preferred=NIXL) for tensor in tensors]
    answers = striping_peer.ask([ref.SerializeToString() for ref in refs[:4]])
    answers += striping_peer.ask([ref.SerializeToString() for ref in refs[4:]])
    assert [answer[1] for answer in answers] == [digest(tensor) for tensor in tensors]
