"""How the shm consumer reads: small payloads (and ``copy=True``) are private copies read with
``preadv``, larger ones are views of a mapping; both check the lease stamp and the segment size,
a copy once it is copied."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from epd.common.errors import FailedPrecondition, InvalidArgument, NotFound
from epd.server.transfer.payload_layout import CONTENT_TAG_BYTES, HEADER_BYTES
from epd.server.transfer.plane import DataPlane
from epd.server.transfer.shm import SMALL_COPY_BYTES, ShmConsumer
from epd.v1 import tensor_pb2

HOST = "host-a"
SMALL, LARGE = SMALL_COPY_BYTES // 4, 4 * SMALL_COPY_BYTES // 4  # float32 elements


@pytest.fixture
def plane() -> Iterator[DataPlane]:
    data_plane = DataPlane(HOST, kinds=("shm",))
    yield data_plane
    assert data_plane.held() == []
    data_plane.close()


def reuse(plane: DataPlane, ref: tensor_pb2.TensorRef, fill: float) -> tensor_pb2.TensorRef:
    """Release ``ref`` and put a tensor of the same size, which lands in the same segment."""
    plane.release([ref.lease_id])
    again = plane.put(torch.full(tuple(ref.shape), fill), HOST)
    assert again.shm.name == ref.shm.name
    return again


def test_a_small_payload_is_a_private_copy(plane: DataPlane) -> None:
    ref = plane.put(torch.full((SMALL,), 1.0), HOST)
    small = plane.get(ref)
    plane.release([reuse(plane, ref, 2.0).lease_id])
    assert torch.equal(small, torch.full((SMALL,), 1.0))


def test_a_large_payload_is_a_view_of_the_segment(plane: DataPlane) -> None:
    ref = plane.put(torch.full((LARGE,), 1.0), HOST)
    view, copy = plane.get(ref), plane.get(ref, copy=True)
    again = reuse(plane, ref, 2.0)
    assert torch.equal(view, torch.full((LARGE,), 2.0)), "a view shows the segment's new tenant"
    assert torch.equal(copy, torch.full((LARGE,), 1.0))
    plane.release([again.lease_id])


@pytest.mark.parametrize("elements", [SMALL, LARGE])
@pytest.mark.parametrize("copy", [False, True])
def test_a_released_reference_is_refused_after_reuse(
    plane: DataPlane, elements: int, copy: bool
) -> None:
    ref = plane.put(torch.ones(elements), HOST)
    again = reuse(plane, ref, 3.0)
    with pytest.raises(NotFound) as caught:
        plane.get(ref, copy=copy)
    assert caught.value.reason == "LEASE_RELEASED"
    plane.release([again.lease_id])


def test_a_small_copy_refuses_a_segment_reused_while_it_was_read(
    monkeypatch: pytest.MonkeyPatch, plane: DataPlane
) -> None:
    ref = plane.put(torch.full((SMALL,), 1.0), HOST)
    tenant: list[tensor_pb2.TensorRef] = []
    preadv = os.preadv

    def preadv_while_the_segment_changes_hands(
        fd: int, buffers: list[bytearray], offset: int
    ) -> int:
        """The read's first half, then the segment released and filled again, then the rest:
        a read is not atomic with respect to the producer."""
        data = bytearray(sum(len(buffer) for buffer in buffers))
        half = len(data) // 2
        num_read = preadv(fd, [memoryview(data)[:half]], offset)
        if not tenant:
            tenant.append(reuse(plane, ref, 2.0))
        num_read += preadv(fd, [memoryview(data)[half:]], offset + half)
        start = 0
        for buffer in buffers:
            buffer[:] = data[start : start + len(buffer)]
            start += len(buffer)
        return num_read

    monkeypatch.setattr(os, "preadv", preadv_while_the_segment_changes_hands)
    with pytest.raises(NotFound) as caught:
        plane.get(ref, copy=True)
    assert caught.value.reason == "LEASE_RELEASED"
    plane.release([tenant[0].lease_id])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(), (0, 8), (3, 5, 7)])
def test_every_dtype_and_shape_reads_back(
    plane: DataPlane, dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    tensor = torch.randn(shape).to(dtype)
    ref = plane.put(tensor, HOST)
    for copy in (False, True):
        read = plane.get(ref, copy=copy)
        assert read.dtype == dtype and read.shape == tensor.shape and torch.equal(read, tensor)
    plane.release([ref.lease_id])


def test_a_reference_past_the_end_of_its_segment_is_refused(plane: DataPlane) -> None:
    ref = plane.put(torch.ones(4), HOST)
    segment_bytes = HEADER_BYTES + (64 << 10)
    for offset, size in ((segment_bytes - 8, 16), (HEADER_BYTES, segment_bytes)):
        bad = tensor_pb2.TensorRef()
        bad.CopyFrom(ref)
        bad.shape[:] = [size // 4]
        bad.byte_size = bad.shm.size = size
        bad.shm.offset = offset
        with pytest.raises(InvalidArgument) as caught:
            plane.get(bad)
        assert caught.value.reason == "TENSOR_SIZE_MISMATCH"
    plane.release([ref.lease_id])


@pytest.mark.parametrize("elements", [SMALL, LARGE])
def test_check_finds_a_payload_still_held_until_its_lease_is_released(
    plane: DataPlane, elements: int
) -> None:
    tag = b"t" * CONTENT_TAG_BYTES
    ref = plane.put(torch.ones(elements), HOST, content_tag=tag)
    plane.get(ref, content_tag=tag)
    plane.check(ref, tag)
    plane.check(ref)
    with pytest.raises(FailedPrecondition) as mismatch:
        plane.check(ref, b"u" * CONTENT_TAG_BYTES)
    assert mismatch.value.reason == "CONTENT_MISMATCH"
    again = reuse(plane, ref, 3.0)
    with pytest.raises(NotFound) as caught:
        plane.check(ref, tag)
    assert caught.value.reason == "LEASE_RELEASED"
    plane.release([again.lease_id])
    with pytest.raises(NotFound):
        plane.check(ref)


def test_check_reads_the_header_alone_without_a_mapping(plane: DataPlane) -> None:
    ref = plane.put(torch.ones(LARGE), HOST)
    consumer = plane.consumers["shm"]
    assert isinstance(consumer, ShmConsumer)
    plane.check(ref)
    assert len(consumer.views) == len(consumer.copies) == 0
    plane.release([ref.lease_id])
