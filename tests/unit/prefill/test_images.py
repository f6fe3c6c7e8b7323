"""ImageResolver with images named by their encoder: fetched, copied, released; refused clearly
when the worker cannot fetch or the message is incomplete."""

from __future__ import annotations

import pytest
import torch

from epd.server.common.errors import FailedPrecondition, InvalidArgument, NotFound
from epd.server.prefill.images import ImageResolver
from epd.server.transfer.plane import DataPlane
from epd.v1 import multimodal_pb2, tensor_pb2


class FakeEncoders:
    """Hands out references to tensors put in ``plane``; records fetches and releases."""

    def __init__(self, plane: DataPlane, tensors: dict[str, torch.Tensor]) -> None:
        self.plane = plane
        self.tensors = tensors
        self.fetched: list[tuple[str, str, str]] = []
        self.released: list[str] = []

    async def fetch(self, endpoint: str, mm_hash: str,
                    consumer_host_id: str) -> tensor_pb2.TensorRef:  # fmt: skip
        self.fetched.append((endpoint, mm_hash, consumer_host_id))
        if mm_hash not in self.tensors:
            raise NotFound(f"no {mm_hash}", reason="MM_HASH_NOT_CACHED")
        return self.plane.put(self.tensors[mm_hash], consumer_host_id)

    def release(self, endpoint: str, lease_ids: list[str]) -> None:
        self.released.extend(lease_ids)
        self.plane.release(lease_ids)


def named(mm_hash: str, endpoint: str = "enc:1") -> multimodal_pb2.ImageInput:
    return multimodal_pb2.ImageInput(mm_hash=mm_hash, grid=multimodal_pb2.ImageGrid(t=1, h=2, w=2),
                                     encoder=multimodal_pb2.EncoderSource(endpoint=endpoint))


@pytest.fixture
def plane():
    plane = DataPlane("host-a", kinds=("shm", "inline"))
    yield plane
    assert plane.held() == []
    plane.close()


async def test_named_images_are_fetched_copied_and_released(plane) -> None:
    tensors = {"a": torch.arange(8.0).reshape(2, 4), "b": torch.ones(1, 4)}
    encoders = FakeEncoders(plane, tensors)
    images = await ImageResolver(plane, encoders=encoders).resolve([named("a"), named("b", "e:2")])
    assert [image.mm_hash for image in images] == ["a", "b"]
    assert all(image.grid == (1, 2, 2) for image in images)
    assert torch.equal(images[0].embeddings, tensors["a"])
    assert torch.equal(images[1].embeddings, tensors["b"])
    assert sorted(e for e, _, _ in encoders.fetched) == ["e:2", "enc:1"]
    assert all(host == "host-a" for _, _, host in encoders.fetched)
    assert len(encoders.released) == 2


async def test_a_fetch_failure_fails_the_request_and_holds_nothing(plane) -> None:
    encoders = FakeEncoders(plane, {"a": torch.ones(1, 4)})
    with pytest.raises(NotFound):
        await ImageResolver(plane, encoders=encoders).resolve([named("a"), named("missing")])


async def test_named_images_are_refused_clearly(plane) -> None:
    with pytest.raises(FailedPrecondition) as caught:
        await ImageResolver(plane).resolve([named("a")])
    assert caught.value.reason == "ENCODER_SOURCE_UNSUPPORTED"
    encoders = FakeEncoders(plane, {})
    with pytest.raises(InvalidArgument) as bad:
        await ImageResolver(plane, encoders=encoders).resolve([named("", "enc:1")])
    assert bad.value.reason == "BAD_ENCODER_SOURCE" and not encoders.fetched
