"""Clients of the services a process calls on every request: the encoder, prefill and decode
workers. Each wraps one peer's long-lived channel, on which gRPC multiplexes every call."""

from __future__ import annotations

import grpc

from epd.v1 import decode_service_pb2_grpc as decode_grpc
from epd.v1 import encode_service_pb2_grpc as encode_grpc
from epd.v1 import prefill_service_pb2_grpc as prefill_grpc


class EncoderClient:
    """``Encode`` and ``Release`` of one encoder."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        stub = encode_grpc.EncodeServiceStub(channel)
        self.Encode = stub.Encode
        self.Release = stub.Release


class PrefillClient:
    """``Prefill`` and ``PrefillDecode`` of one prefill worker."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        stub = prefill_grpc.PrefillServiceStub(channel)
        self.Prefill = stub.Prefill
        self.PrefillDecode = stub.PrefillDecode


class DecodeClient:
    """``Decode`` of one decode worker."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.Decode = decode_grpc.DecodeServiceStub(channel).Decode
