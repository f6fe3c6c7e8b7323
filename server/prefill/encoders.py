"""Embeddings pulled from encoders by a prefill worker (images given as EncoderSource): an Encode
call naming the image by mm_hash, waiting for the encoding the route started at the same time."""

from __future__ import annotations

import logging

import grpc

from epd.server.common.channels import ChannelPool
from epd.server.common.clients import EncoderClient
from epd.server.common.errors import Unavailable
from epd.server.common.status import from_rpc_error
from epd.server.common.tasks import BackgroundCalls
from epd.v1 import encode_service_pb2 as encode_pb
from epd.v1 import multimodal_pb2, tensor_pb2

logger = logging.getLogger(__name__)


class EncoderPulls:
    """One client per encoder endpoint; ``fetch`` gets a reference, ``release`` frees it."""

    def __init__(self, auth_token: str | None = None, *, timeout_s: float = 60.0) -> None:
        """``timeout_s`` bounds one fetch, including the wait for the image to arrive."""
        self.timeout_s = timeout_s
        self._channels = ChannelPool(auth_token)
        self.background = BackgroundCalls()
        self.num_fetched = 0

    async def fetch(self, endpoint: str, mm_hash: str,
                    consumer_host_id: str) -> tensor_pb2.TensorRef:  # fmt: skip
        """The embeddings of ``mm_hash`` at the encoder ``endpoint``, handed to this host."""
        request = encode_pb.EncodeRequest(items=[multimodal_pb2.MediaItem(mm_hash=mm_hash)],
                                          consumer_host_id=consumer_host_id,
                                          await_ms=int(self.timeout_s * 1000))  # fmt: skip
        call = self._stub(endpoint).Encode(request, timeout=self.timeout_s)
        try:
            response = await call.read()
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None
        if response is grpc.aio.EOF:
            raise Unavailable(f"encoder {endpoint} answered nothing for {mm_hash}",
                              reason="ENCODER_NO_ANSWER")  # fmt: skip
        embeddings: tensor_pb2.TensorRef = response.embeddings
        self.num_fetched += 1
        return embeddings

    def release(self, endpoint: str, lease_ids: list[str]) -> None:
        """Free ``lease_ids`` at ``endpoint`` in the background (leases also expire)."""
        if lease_ids:
            self.background.start(self._release(endpoint, lease_ids))

    async def close(self) -> None:
        """Wait for releases in flight, then close every channel."""
        await self.background.settle()
        await self._channels.close()

    async def _release(self, endpoint: str, lease_ids: list[str]) -> None:
        try:
            await self._stub(endpoint).Release(encode_pb.ReleaseRequest(lease_ids=lease_ids),
                                               timeout=5)  # fmt: skip
        except grpc.aio.AioRpcError as e:
            logger.warning("release at %s failed (%s); leases will expire", endpoint, e.details())

    def _stub(self, endpoint: str) -> EncoderClient:
        return self._channels.client(endpoint, EncoderClient)
