"""Pure logic of the data plane: leases, backend choice, reference validation."""

from __future__ import annotations

import ctypes

import pytest
import torch

from epd.common.errors import FailedPrecondition, InvalidArgument, NotFound
from epd.server.transfer.base import LeasedProducer
from epd.server.transfer.nixl import NixlProducer
from epd.server.transfer.nixl_agent import is_available as is_nixl_available
from epd.server.transfer.plane import DataPlane, is_accelerator, parse_kind
from epd.server.transfer.tensors import (
    GIL_HELD_COPY_MAX_BYTES,
    check_layout,
    describe,
    move,
    stage_to_host,
)
from epd.v1 import tensor_pb2


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class RecordingProducer(LeasedProducer[int]):
    """Leases each tensor's first element as its payload and records what it frees."""

    kind = "test"

    def __init__(self, clock: FakeClock) -> None:
        super().__init__("host-a", clock=clock)
        self.freed: list[int] = []

    def put(self, tensor: torch.Tensor, *, ttl_s: float | None = None) -> tensor_pb2.TensorRef:
        ref = describe(tensor)
        self._lease(ref, int(tensor[0]), f"slot{int(tensor[0])}", ttl_s)
        return ref

    def _free(self, payload: int) -> None:
        self.freed.append(payload)


def test_leases_expire_on_the_clock() -> None:
    clock = FakeClock()
    producer = RecordingProducer(clock)
    short = producer.put(torch.tensor([1]), ttl_s=1.0)
    producer.put(torch.tensor([2]), ttl_s=10.0)
    assert (short.host_id, short.lease_expire_time_ms) == ("host-a", 1_001_000)
    assert [info.location for info in producer.held()] == ["slot1", "slot2"]
    clock.now += 1.0
    assert producer.reap_expired() == 1 and producer.freed == [1]
    assert not producer.release(short.lease_id)
    assert [info.location for info in producer.held()] == ["slot2"]
    producer.close()
    assert producer.freed == [1, 2] and producer.held() == []


@pytest.fixture
def plane():
    data_plane = DataPlane("host-a")
    yield data_plane
    assert data_plane.held() == []
    data_plane.close()


@pytest.mark.skipif(not is_nixl_available(), reason="nixl is not installed")
def test_choice_same_host_shm_other_host_nixl_unknown_host_inline(plane: DataPlane) -> None:
    assert plane.choose("host-a", 0) == tensor_pb2.TRANSFER_KIND_SHM
    assert plane.choose("host-b", 0) == tensor_pb2.TRANSFER_KIND_NIXL
    assert plane.choose("", 0) == tensor_pb2.TRANSFER_KIND_INLINE
    assert plane.choose("host-b", tensor_pb2.TRANSFER_KIND_SHM) == tensor_pb2.TRANSFER_KIND_SHM
    assert plane.choose("host-a", tensor_pb2.TRANSFER_KIND_NIXL) == tensor_pb2.TRANSFER_KIND_NIXL


@pytest.mark.skipif(not is_nixl_available(), reason="nixl is not installed")
def test_a_device_tensor_for_a_device_consumer_goes_over_nixl_even_on_one_host(
    plane: DataPlane,
) -> None:
    device = {"on_device": True, "consumer_device": "cuda:0"}
    assert plane.choose("host-a", 0, **device) == tensor_pb2.TRANSFER_KIND_NIXL
    assert plane.choose("", 0, **device) == tensor_pb2.TRANSFER_KIND_NIXL
    assert plane.choose("host-a", 0, on_device=True) == tensor_pb2.TRANSFER_KIND_SHM
    assert plane.choose("host-a", 0, on_device=True, consumer_device="cpu") == (
        tensor_pb2.TRANSFER_KIND_SHM
    )
    assert plane.choose("host-a", 0, consumer_device="cuda:0") == tensor_pb2.TRANSFER_KIND_SHM
    assert plane.choose("host-a", tensor_pb2.TRANSFER_KIND_SHM, **device) == (
        tensor_pb2.TRANSFER_KIND_SHM
    )
    nixl = plane.producers[tensor_pb2.TRANSFER_KIND_NIXL]
    assert isinstance(nixl, NixlProducer)
    nixl.lends_device_memory = False  # NOTE: as after NIXL refused to register GPU memory once
    assert plane.choose("host-a", 0, **device) == tensor_pb2.TRANSFER_KIND_SHM
    assert plane.choose("host-b", 0, **device) == tensor_pb2.TRANSFER_KIND_NIXL


def test_a_device_choice_without_nixl_stays_on_the_host_paths() -> None:
    plane = DataPlane("host-a", kinds=("shm", "inline"))
    device = {"on_device": True, "consumer_device": "cuda:0"}
    assert plane.choose("host-a", 0, **device) == tensor_pb2.TRANSFER_KIND_SHM
    assert plane.choose("host-b", 0, **device) == tensor_pb2.TRANSFER_KIND_INLINE
    plane.close()


def test_host_memory_names() -> None:
    assert not is_accelerator("") and not is_accelerator("cpu")
    assert is_accelerator("cuda:0") and is_accelerator("xpu:1") and is_accelerator("cuda")


@pytest.mark.parametrize("kind", ["shm", "inline"])
def test_get_on_the_host_device_is_the_plain_read(kind: str) -> None:
    plane = DataPlane("host-a", forced_kind=kind)
    tensor = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    ref = plane.put(tensor, "host-a", consumer_device="cpu")
    for device in ("", "cpu"):
        got = plane.get(ref, device=device, copy=True)
        assert got.device.type == "cpu" and torch.equal(got, tensor)
    plane.release([ref.lease_id])
    plane.close()


@pytest.mark.parametrize(
    "tensor",
    [
        torch.arange(24, dtype=torch.float32).reshape(2, 3, 4),
        torch.arange(40, dtype=torch.float32).reshape(5, 8).to(torch.bfloat16)[:, 1:6],
        torch.zeros(0, 7),
    ],
    ids=["contiguous", "strided-bf16", "empty"],
)
def test_staging_to_host_writes_the_payload_in_c_order(tensor: torch.Tensor) -> None:
    buffer = bytearray(tensor.nbytes + 8)
    address = ctypes.addressof((ctypes.c_char * len(buffer)).from_buffer(buffer))
    stage_to_host(address, tensor)
    expected = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    assert bytes(buffer[: tensor.nbytes]) == expected
    assert bytes(buffer[tensor.nbytes :]) == bytes(8)


def test_choice_without_nixl_falls_back_to_inline() -> None:
    plane = DataPlane("host-a", kinds=("shm", "inline"))
    assert plane.choose("host-a", 0) == tensor_pb2.TRANSFER_KIND_SHM
    assert plane.choose("host-b", 0) == tensor_pb2.TRANSFER_KIND_INLINE
    with pytest.raises(FailedPrecondition, match="nixl") as raised:
        plane.choose("host-b", tensor_pb2.TRANSFER_KIND_NIXL)
    assert raised.value.reason == "TRANSFER_UNAVAILABLE"
    plane.close()
    with pytest.raises(ValueError, match="unknown transfer kinds"):
        DataPlane("host-a", kinds=("shm", "pigeon"))


def test_a_forced_kind_wins_over_the_automatic_choice() -> None:
    forced = DataPlane("host-a", forced_kind="inline")
    assert forced.choose("host-a", 0) == tensor_pb2.TRANSFER_KIND_INLINE
    forced.close()
    with pytest.raises(ValueError, match="unknown transfer kind"):
        parse_kind("carrier-pigeon")


def test_inline_refuses_oversized_tensors() -> None:
    small = DataPlane("host-a", max_inline_bytes=1024, kinds=("shm", "inline"))
    with pytest.raises(InvalidArgument) as caught:
        small.put(torch.zeros(1024), "host-b")
    assert caught.value.reason == "INLINE_TOO_LARGE"
    small.close()


def test_zero_copy_view_and_private_copy(plane: DataPlane) -> None:
    tensor = torch.arange(12 * 1024, dtype=torch.float32).reshape(3, 4096)
    ref = plane.put(tensor, "host-a")
    view, copy = plane.get(ref), plane.get(ref, copy=True)
    assert torch.equal(view, tensor) and torch.equal(copy, tensor)
    view.add_(1)
    assert torch.equal(plane.get(ref), tensor)
    plane.release([ref.lease_id])


def test_empty_and_scalar_tensors(plane: DataPlane) -> None:
    for tensor in (torch.zeros(0, 8), torch.tensor(3.5)):
        ref = plane.put(tensor, "host-a")
        assert torch.equal(plane.get(ref), tensor)
        plane.release([ref.lease_id])


@pytest.mark.parametrize(
    "mutate, error, reason",
    [
        (lambda r: setattr(r, "dtype", 0), InvalidArgument, "BAD_TENSOR_REF"),
        (
            lambda r: setattr(r, "byte_size", r.byte_size + 4),
            InvalidArgument,
            "TENSOR_SIZE_MISMATCH",
        ),
        (lambda r: r.ClearField("shm"), InvalidArgument, "BAD_TENSOR_REF"),
        (lambda r: setattr(r.shm, "name", "epd-1-1-999999"), NotFound, "SEGMENT_NOT_FOUND"),
        (lambda r: setattr(r.shm, "name", "../etc/passwd"), InvalidArgument, "BAD_TENSOR_REF"),
        (lambda r: setattr(r, "host_id", "host-z"), FailedPrecondition, "FOREIGN_HOST"),
        (lambda r: setattr(r, "lease_expire_time_ms", 1), NotFound, "LEASE_EXPIRED"),
        (lambda r: r.shape.append(-1), InvalidArgument, "BAD_TENSOR_REF"),
    ],
)
def test_bad_references_raise_typed_errors(plane: DataPlane, mutate, error, reason) -> None:
    ref = plane.put(torch.ones(4, 4), "host-a")
    bad = tensor_pb2.TensorRef()
    bad.CopyFrom(ref)
    mutate(bad)
    with pytest.raises(error) as caught:
        plane.get(bad)
    assert caught.value.reason == reason
    plane.release([ref.lease_id])


def test_inline_payload_length_is_checked() -> None:
    ref = describe(torch.ones(4))
    ref.inline_data = b"\0" * 3
    assert check_layout(ref) == (torch.float32, [4])
    with pytest.raises(InvalidArgument, match="3 bytes"):
        DataPlane("h").get(ref)


def test_unsupported_dtype_is_refused(plane: DataPlane) -> None:
    with pytest.raises(InvalidArgument) as caught:
        plane.put(torch.zeros(2, dtype=torch.complex64), "host-a")
    assert caught.value.reason == "UNSUPPORTED_DTYPE"


def test_two_planes_in_one_process_never_share_a_segment_name() -> None:
    # NOTE: failed with FileExistsError when each pool numbered its segments from 1.
    first, second = DataPlane("host-a"), DataPlane("host-a")
    refs = [plane.put(torch.ones(8), "host-a") for plane in (first, second)]
    assert refs[0].shm.name != refs[1].shm.name
    for plane, ref in zip((first, second), refs, strict=True):
        assert torch.equal(plane.get(ref), torch.ones(8))
        plane.release([ref.lease_id])
        plane.close()


def test_lease_ids_are_unique_across_threads_and_forks() -> None:
    import os
    import threading

    from epd.server.transfer.base import new_lease_id

    drawn: list[str] = []
    threads = [
        threading.Thread(target=lambda: drawn.extend(new_lease_id() for _ in range(600)))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(drawn)) == len(drawn) == 2400
    assert all(len(lease_id) == 32 and int(lease_id, 16) >= 0 for lease_id in drawn)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write_end, new_lease_id().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read_end, 64).decode() != new_lease_id()  # the child drew its own
    os.close(read_end)
    os.close(write_end)


@pytest.mark.parametrize(
    "num_bytes", [1, 4096, GIL_HELD_COPY_MAX_BYTES, GIL_HELD_COPY_MAX_BYTES + 1]
)
def test_move_copies_exactly_with_and_without_the_gil(num_bytes: int) -> None:
    source = torch.randint(0, 256, (num_bytes + 8,), dtype=torch.uint8)
    destination = torch.zeros(num_bytes + 8, dtype=torch.uint8)
    move(destination.data_ptr() + 4, source.data_ptr(), num_bytes)
    assert torch.equal(destination[4 : 4 + num_bytes], source[:num_bytes])
    assert destination[:4].sum() == 0 and destination[4 + num_bytes :].sum() == 0
