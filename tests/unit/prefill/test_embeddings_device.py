"""A prefill worker reads a prompt's embeddings into its engine's embeddings device."""

from __future__ import annotations

import pytest
import torch

from epd.common.roles import Role
from epd.server.engine.base import Sampling
from epd.server.prefill.worker import PrefillWorker
from epd.v1 import generation_pb2, multimodal_pb2, tensor_pb2
from tests.engines import CannedEngine


class RecordingPlane:
    """A data plane stand-in whose every read is a zero row, recorded with its arguments."""

    def __init__(self) -> None:
        self.reads: list[tuple[str, bool, str]] = []

    def get(
        self, ref: tensor_pb2.TensorRef, *, copy: bool = False, device: str = ""
    ) -> torch.Tensor:
        self.reads.append((ref.lease_id, copy, device))
        return torch.zeros(1, 8)


@pytest.mark.parametrize("device", ["cuda:0", "cpu"])
async def test_embeddings_are_read_into_the_engines_embeddings_device(device: str) -> None:
    plane, engine = RecordingPlane(), CannedEngine(embeddings_device=device)
    worker = PrefillWorker(engine, plane, Role.PREFILL_DECODE)  # type: ignore[arg-type]
    image = multimodal_pb2.ImageInput(
        mm_hash="h",
        grid=multimodal_pb2.ImageGrid(t=1, h=2, w=2),
        embeddings=tensor_pb2.TensorRef(lease_id="lease-0"),
    )
    prompt = generation_pb2.Prompt(token_ids=[1, 2], images=[image])
    chunks = [chunk async for chunk in worker.generate("req", "tiny", prompt, Sampling())]
    assert [chunk.finish_reason for chunk in chunks] == ["stop"]
    assert plane.reads == [("lease-0", True, device)]
    assert [image.mm_hash for image in engine.images] == ["h"]
