"""An in-memory stand-in for an encode worker's client, recording every call; like the real client
it fails with domain errors."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from epd.common.errors import EpdError
from epd.v1 import encode_service_pb2 as encode_pb
from epd.v1 import tensor_pb2
from tests.unit.route.fake_stream import FakeStream


def embeddings(endpoint: str, lease: str, location: str = "shm") -> tensor_pb2.TensorRef:
    """A reference to the embeddings leased as ``lease`` by ``endpoint``, in shared memory or
    (``nixl``) behind a NIXL agent."""
    ref = tensor_pb2.TensorRef(lease_id=lease, producer_endpoint=endpoint, byte_size=4)
    if location == "nixl":
        ref.nixl.agent_name = f"agent-{endpoint}"
    else:
        ref.shm.name = f"segment-{lease}"
    return ref


@dataclass
class FakeEncoder:
    """Encodes every item, or fails with ``error`` after ``num_before_error`` items; answers
    once ``hold`` is set, if given."""

    endpoint: str
    error: EpdError | None = None
    num_before_error: int = 0
    hold: asyncio.Event | None = None
    linger: asyncio.Event | None = None
    location: str = "shm"
    streams: list[FakeStream] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    requests: list[Any] = field(default_factory=list)

    def Encode(self, request: Any, timeout: float | None = None) -> FakeStream:
        self.requests.append(request)
        count = self.num_before_error if self.error else len(request.items)
        responses = [
            encode_pb.EncodeResponse(
                item_index=i,
                mm_hash=request.items[i].mm_hash,
                embeddings=embeddings(
                    self.endpoint, f"{self.endpoint}/{request.items[i].mm_hash}", self.location
                ),
            )
            for i in range(count)
        ]
        self.streams.append(FakeStream(responses, self.error, self.hold, self.linger))
        return self.streams[-1]

    async def Release(self, request: Any, timeout: float | None = None) -> Any:
        self.released.extend(request.lease_ids)
        return encode_pb.ReleaseResponse()
