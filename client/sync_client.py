"""Blocking SDK client: the same calls as ``AsyncEpdClient``, for scripts and notebooks; the
message builders (``user``, ``system``, ``assistant``) are exported here too.

    from epd.client.sync_client import EpdClient, user

    with EpdClient("127.0.0.1:50050") as client:
        answer = client.generate([user("What is in this picture?", image="cat.png")],
                                 max_tokens=32)
        print(answer.text, answer.usage)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Unpack

import grpc

from epd.client.errors import EpdClientError
from epd.client.messages import (
    Chunk,
    Message,
    Picture,
    assistant,
    build_request,
    join,
    system,
    to_chunk,
    user,
)
from epd.client.options import RequestOptions
from epd.common.auth import bearer_metadata
from epd.common.channels import TlsFiles, create_blocking_channel
from epd.v1 import route_service_pb2, route_service_pb2_grpc

__all__ = ["Chunk", "EpdClient", "Message", "Picture", "assistant", "system", "user"]

Metadata = Sequence[tuple[str, str]]


class EpdClient:
    """Blocking client of one route endpoint (host:port). Use as a context manager.

    Options as in ``AsyncEpdClient``: ``auth_token`` (bearer), ``tls_ca_file`` (TLS),
    ``tls_cert_file`` + ``tls_key_file`` (mTLS), ``timeout_s`` (default deadline per call).
    """

    def __init__(
        self,
        endpoint: str,
        *,
        auth_token: str | None = None,
        tls_ca_file: str | None = None,
        tls_cert_file: str | None = None,
        tls_key_file: str | None = None,
        timeout_s: float | None = 300.0,
    ) -> None:
        # NOTE: the same target, TLS credentials and options as AsyncEpdClient's channel.
        self._channel = create_blocking_channel(
            endpoint,
            tls=TlsFiles(tls_ca_file, tls_cert_file, tls_key_file),
        )
        self._stub = route_service_pb2_grpc.RouteServiceStub(self._channel)
        self._auth = (bearer_metadata(auth_token),) if auth_token else ()
        self.timeout_s = timeout_s

    def __enter__(self) -> EpdClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def stream(
        self,
        messages: Sequence[Message],
        *,
        timeout_s: float | None = -1.0,
        metadata: Metadata = (),
        **options: Unpack[RequestOptions],
    ) -> Iterator[Chunk]:
        """Yield the answer to ``messages`` chunk by chunk (arguments as in
        ``AsyncEpdClient.stream``); closing the iterator early cancels the request."""
        call = self._stub.Generate(
            build_request(messages, **options),
            timeout=self._timeout(timeout_s),
            metadata=self._auth + tuple(metadata),
        )
        try:
            for response in call:
                yield to_chunk(response)
        except grpc.RpcError as e:
            raise EpdClientError.from_rpc_error(e) from None
        finally:
            call.cancel()

    def generate(
        self,
        messages: Sequence[Message],
        *,
        timeout_s: float | None = -1.0,
        metadata: Metadata = (),
        **options: Unpack[RequestOptions],
    ) -> Chunk:
        """The whole answer as one chunk."""
        return join(list(self.stream(messages, timeout_s=timeout_s, metadata=metadata, **options)))

    def list_models(self, *, metadata: Metadata = ()) -> list[str]:
        """Ids of the models the deployment serves."""
        try:
            reply = self._stub.ListModels(
                route_service_pb2.ListModelsRequest(),
                timeout=self._timeout(-1.0),
                metadata=self._auth + tuple(metadata),
            )
        except grpc.RpcError as e:
            raise EpdClientError.from_rpc_error(e) from None
        return [model.id for model in reply.models]

    def _timeout(self, timeout_s: float | None) -> float | None:
        return self.timeout_s if timeout_s is not None and timeout_s < 0 else timeout_s
