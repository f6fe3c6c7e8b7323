"""Python SDK for epd's RouteService (async; ``EpdClient`` in ``sync_client`` is the blocking
twin with the same methods). The message builders (``user``, ``system``, ``assistant``) are
exported here too, so one import is enough.

    from epd.client.sdk import AsyncEpdClient, user

    async with AsyncEpdClient("127.0.0.1:50050") as client:
        async for chunk in client.stream([user("What is in this picture?", image="cat.png")]):
            print(chunk.text, end="", flush=True)

Images may be bytes, PIL images, local files (a path, or a file: URL; read by the client) or
URLs the server fetches (http(s) or data:); schemes in any case, any other is refused
(``Picture``). ``max_tokens`` left out is the route's default, the same as over its OpenAI HTTP
port: the rest of the model's context. Failures raise ``EpdClientError`` subclasses carrying the
status code and the server's ErrorInfo reason.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
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
from epd.common.channels import TlsFiles, create_channel
from epd.v1 import route_service_pb2, route_service_pb2_grpc

__all__ = ["AsyncEpdClient", "Chunk", "Message", "Picture", "assistant", "system", "user"]

Metadata = Sequence[tuple[str, str]]


class AsyncEpdClient:
    """Async client of one route endpoint (host:port). Use as an async context manager.

    ``auth_token``: sent as ``authorization: Bearer``. ``tls_ca_file``: serve-side CA, turns TLS
    on; ``tls_cert_file`` + ``tls_key_file``: client certificate for mTLS. ``timeout_s``: default
    deadline of each call (None: none), overridable per call.
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
        self._channel = create_channel(
            endpoint,
            auth_token=auth_token,
            tls=TlsFiles(tls_ca_file, tls_cert_file, tls_key_file),
        )
        self._stub = route_service_pb2_grpc.RouteServiceStub(self._channel)
        self.timeout_s = timeout_s

    async def __aenter__(self) -> AsyncEpdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel (cancels calls in flight)."""
        await self._channel.close()

    async def stream(
        self,
        messages: Sequence[Message],
        *,
        timeout_s: float | None = -1.0,
        metadata: Metadata = (),
        **options: Unpack[RequestOptions],
    ) -> AsyncIterator[Chunk]:
        """Stream the answer to ``messages``.

        ``options``: ``RequestOptions`` (model, vLLM's sampling options, a structured output,
        logprobs, n, tools and tool_choice, chat_template_kwargs, stream_interval,
        beam search, add_generation_prompt and continue_final_message, include_reasoning,
        return_prompt_text, echo, truncate_prompt_tokens and truncation_side,
        add_special_tokens, return_token_ids, reasoning_effort, chat_template, documents,
        encoder_policy, request_id).
        ``timeout_s``: this call's deadline (default: the client's). ``metadata``: extra gRPC
        metadata pairs. Breaking out of the loop cancels the request on every service.
        """
        request = build_request(messages, **options)
        call = self._stub.Generate(
            request, timeout=self._timeout(timeout_s), metadata=tuple(metadata) or None
        )
        try:
            async for response in call:
                yield to_chunk(response)
        except grpc.aio.AioRpcError as e:
            raise EpdClientError.from_rpc_error(e) from None
        finally:
            call.cancel()

    async def generate(
        self,
        messages: Sequence[Message],
        *,
        timeout_s: float | None = -1.0,
        metadata: Metadata = (),
        **options: Unpack[RequestOptions],
    ) -> Chunk:
        """The whole answer as one chunk (arguments as in ``stream``)."""
        return join(
            [
                chunk
                async for chunk in self.stream(
                    messages, timeout_s=timeout_s, metadata=metadata, **options
                )
            ]
        )

    async def list_models(self, *, metadata: Metadata = ()) -> list[str]:
        """Ids of the models the deployment serves (empty before any worker registered)."""
        try:
            reply = await self._stub.ListModels(
                route_service_pb2.ListModelsRequest(),
                timeout=self._timeout(-1.0),
                metadata=tuple(metadata) or None,
            )
        except grpc.aio.AioRpcError as e:
            raise EpdClientError.from_rpc_error(e) from None
        return [model.id for model in reply.models]

    def _timeout(self, timeout_s: float | None) -> float | None:
        return self.timeout_s if timeout_s is not None and timeout_s < 0 else timeout_s
