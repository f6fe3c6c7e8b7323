"""The route's logic: one chat request through encode and prefill(+decode), streamed back.

Order: load every image under the media rules (hash + validation, once per source), render and
tokenise the chat, have the images encoded (scheduler assignment, concurrent encoders, retries),
pick a prefill worker by multimodal prefix overlap, stream its tokens as text deltas. A prefill
failing with UNAVAILABLE before the first token is retried on another worker; after the first
token a failure ends the stream with its status. Every lease is released at the end.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from opentelemetry import trace

from epd.server.common.errors import EpdError, Unavailable
from epd.server.common.status import from_rpc_error
from epd.server.media.loader import MediaLoader
from epd.server.route.encoding import EncodeStage, encode_all, is_retryable, release_all
from epd.server.route.peers import Peers
from epd.server.route.prompt import ChatPart, Detokenizer, PromptBuilder
from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2
from epd.v1 import prefill_service_pb2 as prefill_pb
from epd.v1 import scheduler_service_pb2 as scheduler_pb

MAX_PREFILL_ATTEMPTS = 2
Chat = list[tuple[str, list[ChatPart]]]
Media = multimodal_pb2.MediaItem


@dataclass(frozen=True, slots=True)
class RouteChunk:
    """A piece of the answer."""

    text: str
    token_ids: list[int]
    finish_reason: int = 0
    usage: generation_pb2.Usage | None = None


class RouteWorker:
    """Runs requests for one model against the services the scheduler knows."""

    def __init__(self, peers: Peers, prompts: PromptBuilder, loader: MediaLoader, *,
                 model_id: str, host_id: str) -> None:  # fmt: skip
        self.peers = peers
        self.prompts = prompts
        self.loader = loader
        self.model_id = model_id
        self.host_id = host_id

    async def generate(self, request: route_service_pb2.GenerateRequest,
                       timeout_s: float | None = None) -> AsyncIterator[RouteChunk]:  # fmt: skip
        """Stream the answer to ``request``."""
        span = trace.get_current_span()
        request_id = request.request_id or uuid.uuid4().hex
        span.set_attribute("epd.request_id", request_id)
        messages, media = self._chat(request)
        loaded = await asyncio.gather(*(self.loader.load(url=m.url, data=m.data) for m in media))
        items = [multimodal_pb2.MediaItem(mm_hash=image.mm_hash, url=m.url, data=m.data)
                 for image, m in zip(loaded, media, strict=True)]  # fmt: skip
        token_ids = self.prompts.token_ids(messages)
        stage = EncodeStage(request_id, self.model_id, items, request.encoder_policy, self.host_id)
        span.set_attribute("epd.images", len(items))
        try:
            if items:
                await encode_all(self.peers, stage, timeout_s)
                span.set_attribute("epd.encoder_ids", sorted(stage.encoder_ids))
                span.set_attribute("epd.cache_hits",
                                   sum(r.cache_hit for r in stage.results.values()))
            prompt = self._prompt(token_ids, stage)
            async for chunk in self._prefill_decode(request_id, prompt, request.sampling,
                                                    timeout_s):  # fmt: skip
                yield chunk
        finally:
            await release_all(self.peers, stage)

    def _chat(self, request: route_service_pb2.GenerateRequest) -> tuple[Chat, list[Media]]:
        messages: Chat = []
        media: list[Media] = []
        for message in request.messages:
            parts = []
            for part in message.content:
                if part.WhichOneof("part") == "image":
                    parts.append(ChatPart(image_index=len(media)))
                    media.append(part.image)
                else:
                    parts.append(ChatPart(text=part.text))
            messages.append((message.role, parts))
        return messages, media

    def _prompt(self, token_ids: list[int], stage: EncodeStage) -> generation_pb2.Prompt:
        images = []
        for index in range(len(stage.items)):
            result = stage.results[index]
            images.append(multimodal_pb2.ImageInput(mm_hash=result.mm_hash, grid=result.grid,
                                                    embeddings=result.embeddings))  # fmt: skip
        return generation_pb2.Prompt(token_ids=token_ids, images=images)

    def _block_hashes(self, prompt: generation_pb2.Prompt) -> list[int]:
        merge = self.prompts.merge_size**2
        return self.prompts.block_hashes(list(prompt.token_ids), [
            (image.mm_hash, image.grid.t * image.grid.h * image.grid.w // merge)
            for image in prompt.images])  # fmt: skip

    async def _prefill_decode(self, request_id: str, prompt: generation_pb2.Prompt,
                              sampling: generation_pb2.SamplingParams,
                              timeout_s: float | None) -> AsyncIterator[RouteChunk]:  # fmt: skip
        hashes, excluded = self._block_hashes(prompt), list[str]()
        for attempt in range(MAX_PREFILL_ATTEMPTS):
            choice = await self.peers.scheduler.ChoosePrefill(scheduler_pb.ChoosePrefillRequest(
                request_id=request_id, model=self.model_id, block_hashes=hashes,
                exclude_worker_ids=excluded,
                roles=[scheduler_pb.WORKER_ROLE_PREFILL_DECODE]), timeout=timeout_s)  # fmt: skip
            trace.get_current_span().set_attribute("epd.prefill_id", choice.worker.id)
            call = self.peers.prefill(choice.worker.endpoint).PrefillDecode(
                prefill_pb.PrefillDecodeRequest(request_id=request_id, model=self.model_id,
                                                prompt=prompt, sampling=sampling),
                timeout=timeout_s)  # fmt: skip
            detokenizer, started = Detokenizer(self.prompts.tokenizer), False
            try:
                async for response in call:
                    started = True
                    yield RouteChunk(detokenizer.add(list(response.token_ids)),
                                     list(response.token_ids), response.finish_reason,
                                     response.usage if response.HasField("usage") else None)
                return
            except grpc.aio.AioRpcError as e:
                error: EpdError = from_rpc_error(e)
                if started or not is_retryable(error) or attempt + 1 == MAX_PREFILL_ATTEMPTS:
                    raise error from None
                excluded.append(choice.worker.id)
        raise Unavailable("no prefill worker could serve the request", reason="PREFILL_FAILED")
