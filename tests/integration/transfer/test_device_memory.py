"""Embeddings in GPU memory through the data plane (these tests need CUDA; they skip here).

A GPU encoder's embeddings stay on its GPU until handed over. To a consumer that reads into a GPU,
NIXL lends them from device memory (stamp and payload registered as VRAM) and the consumer READs
them into its own GPU memory; to any other consumer, every backend stages them to host memory
once, straight into the payload it hands over. Run them first on a machine with a GPU:
``.venv/bin/python -m pytest tests/integration/transfer/test_device_memory.py
tests/unit/encode/test_encode_parts.py -k "device or cuda" -v``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from epd.common.errors import NotFound
from epd.server.transfer import nixl_agent
from epd.server.transfer.nixl import NixlProducer
from epd.server.transfer.nixl_consumer import NixlConsumer
from epd.server.transfer.plane import DataPlane
from epd.v1 import tensor_pb2
from tests.integration.transfer.peers import SPAWN

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

GPU = "cuda:0"
NIXL = tensor_pb2.TRANSFER_KIND_NIXL


def embeddings(seed: int, rows: int = 1024, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """A [rows, 1280] tensor on the GPU, as a vision tower leaves it."""
    generator = torch.Generator(device=GPU).manual_seed(seed)
    return torch.randn(rows, 1280, generator=generator, device=GPU).to(dtype)


@pytest.fixture
def plane() -> Iterator[DataPlane]:
    data_plane = DataPlane("host-a")
    yield data_plane
    data_plane.close()
    assert data_plane.held() == []


@pytest.mark.parametrize("kind", ["shm", "nixl", "inline"])
def test_a_device_tensor_for_a_host_consumer_is_staged_once(kind: str) -> None:
    plane = DataPlane("host-a", forced_kind=kind)
    tensor = embeddings(0, rows=64)
    ref = plane.put(tensor, "host-a")
    if kind == "nixl":
        assert ref.nixl.memory_type == tensor_pb2.NIXL_MEMORY_TYPE_DRAM
    host = plane.get(ref, copy=True)
    assert host.device.type == "cpu" and torch.equal(host, tensor.cpu())
    plane.release([ref.lease_id])
    plane.close()


def test_nixl_lends_device_memory_to_a_device_consumer(plane: DataPlane) -> None:
    producer = plane.producers[NIXL]
    consumer = plane.consumers["nixl"]
    assert isinstance(producer, NixlProducer) and isinstance(consumer, NixlConsumer)
    tensor = embeddings(1)
    ref = plane.put(tensor, "host-a", consumer_device=GPU)
    assert ref.WhichOneof("location") == "nixl", "a GPU consumer on one host still gets NIXL"
    assert producer.lends_device_memory, "this NIXL build did not register GPU memory"
    assert ref.nixl.memory_type == tensor_pb2.NIXL_MEMORY_TYPE_VRAM
    assert [d.device_id for d in ref.nixl.descriptors] == [0, 0]
    got = plane.get(ref, device=GPU)
    assert consumer.reads_into_device
    assert got.device == torch.device(GPU) and torch.equal(got, tensor)
    assert got.data_ptr() != tensor.data_ptr()
    second = plane.put(tensor, "host-a", consumer_device=GPU)
    host = plane.get(second, copy=True)
    assert host.device.type == "cpu" and torch.equal(host, tensor.cpu())
    plane.release([ref.lease_id, second.lease_id])


def test_a_released_device_lease_is_not_read(plane: DataPlane) -> None:
    tensor = embeddings(2)
    ref = plane.put(tensor, "host-a", consumer_device=GPU)
    plane.release([ref.lease_id])
    reused = plane.put(embeddings(3), "host-a", consumer_device=GPU)
    with pytest.raises(NotFound):
        plane.get(ref, device=GPU)
    plane.release([reused.lease_id])


def test_host_references_are_copied_up_to_the_device(plane: DataPlane) -> None:
    tensor = torch.randn(300, 64)
    for kind in (tensor_pb2.TRANSFER_KIND_SHM, NIXL, tensor_pb2.TRANSFER_KIND_INLINE):
        ref = plane.put(tensor, "host-a", preferred=kind)
        got = plane.get(ref, device=GPU)
        assert got.device == torch.device(GPU) and torch.equal(got.cpu(), tensor)
        plane.release([ref.lease_id])


def test_one_blob_of_metadata_covers_one_memory_type() -> None:
    agent = nixl_agent.process_agent()
    host = torch.zeros(1 << 16, dtype=torch.uint8)
    device = torch.zeros(1 << 16, dtype=torch.uint8, device=GPU)
    assert agent.share(host.data_ptr(), host.nbytes)
    assert agent.share(device.data_ptr(), device.nbytes, "VRAM", 0)
    with pytest.raises(ValueError, match="one memory type"):
        agent.metadata_of([host.data_ptr(), device.data_ptr()])
    agent.unshare(host.data_ptr())
    agent.unshare(device.data_ptr())


def read_on_the_gpu(ref_bytes: bytes, results: object) -> None:
    """In another process: read a reference into the GPU; put (checksum, device) on the queue."""
    consumer_plane = DataPlane("host-b")
    ref = tensor_pb2.TensorRef.FromString(ref_bytes)
    got = consumer_plane.get(ref, device=GPU)
    results.put((float(got.float().sum()), str(got.device)))  # type: ignore[attr-defined]
    consumer_plane.close()


def test_another_process_reads_device_memory_into_its_gpu(plane: DataPlane) -> None:
    tensor = embeddings(4)
    ref = plane.put(tensor, "host-b", consumer_device=GPU)
    assert ref.nixl.memory_type == tensor_pb2.NIXL_MEMORY_TYPE_VRAM
    results = SPAWN.Queue()
    process = SPAWN.Process(target=read_on_the_gpu, args=(ref.SerializeToString(), results))
    process.start()
    checksum, device = results.get(timeout=120)
    process.join(30)
    assert device == GPU
    assert checksum == pytest.approx(float(tensor.float().sum()), rel=1e-6)
    plane.release([ref.lease_id])
