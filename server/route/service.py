"""The route's logic: one chat request through encode, prefill and decode, streamed back.

Order: load every image under the media rules (validation, mm_hash and grid, once per source),
render and tokenise the chat, pick the path from the roles live now (``topology``), have the
images encoded (scheduler assignment, concurrent encoders, retries elsewhere) or pass them raw to
an encode_prefill worker while the scheduler chooses the prefill worker (KV-aware, from the hashes
of the expanded prompt), stream the engine's tokens as text deltas (``hops``). Every embedding
lease is released at its encoder once the prompt has been prefilled, or when the request ends,
whatever happened.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import grpc
from opentelemetry import trace

from epd.server.common.status import from_rpc_error
from epd.server.media.grid import ImageGridder
from epd.server.media.loader import LoadedImage, MediaLoader
from epd.server.route.deadline import Deadline
from epd.server.route.encoding import EncodeStage, encode_all, release_all
from epd.server.route.hops import EngineCall, choose_prefill, concurrently, stream_tokens
from epd.server.route.peers import Peers
from epd.server.route.prompt import ChatPart, Detokenizer, PromptBuilder
from epd.server.route.topology import Plan, Role, RoleView, plan_for
from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2
from epd.v1 import scheduler_service_pb2 as scheduler_pb

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
                 model_id: str, host_id: str, grids: ImageGridder) -> None:  # fmt: skip
        self.peers = peers
        self.prompts = prompts
        self.loader = loader
        self.model_id = model_id
        self.host_id = host_id
        self.grids = grids
        self.roles = RoleView()

    async def generate(self, request: route_service_pb2.GenerateRequest,
                       timeout_s: float | None = None) -> AsyncIterator[RouteChunk]:  # fmt: skip
        """Stream the answer to ``request``."""
        deadline = Deadline(timeout_s)
        span = trace.get_current_span()
        request_id = request.request_id or uuid.uuid4().hex
        model = request.model or self.model_id
        span.set_attribute("epd.request_id", request_id)
        messages, media = self._chat(request)
        loaded = await asyncio.gather(*(self.loader.load(url=m.url, data=m.data) for m in media))
        grids = [self._grid(image) for image in loaded]
        items = [_with_hash(m, image.mm_hash) for image, m in zip(loaded, media, strict=True)]
        token_ids = self.prompts.token_ids(messages)
        live_roles = await self._live_roles(model, deadline)
        plan = plan_for(live_roles, len(items))
        span.set_attribute("epd.images", len(items))
        span.set_attribute("epd.encoder_policy", int(request.encoder_policy))
        stage = EncodeStage(request_id, model, items, request.encoder_policy, self.host_id,
                            [self.grids.num_tokens((g.t, g.h, g.w)) for g in grids])
        call = EngineCall(request_id, model, generation_pb2.Prompt(), request.sampling,
                          self._block_hashes(token_ids, items, grids), plan, live_roles,
                          deadline)  # fmt: skip
        try:
            prompt, choice = await concurrently(
                self._prompt(token_ids, stage, plan, grids, deadline),
                choose_prefill(self.peers, call))  # fmt: skip
            detokenizer = Detokenizer(self.prompts.tokenizer)
            async for piece in stream_tokens(self.peers, replace(call, prompt=prompt),
                                             lambda: release_all(self.peers, stage), choice):
                yield RouteChunk(detokenizer.add(piece.token_ids), piece.token_ids,
                                 piece.finish_reason, piece.usage)
        finally:
            await asyncio.shield(release_all(self.peers, stage))

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

    def _grid(self, image: LoadedImage) -> multimodal_pb2.ImageGrid:
        t, h, w = self.grids.grid(image.image)
        return multimodal_pb2.ImageGrid(t=t, h=h, w=w)

    async def _live_roles(self, model: str, deadline: Deadline) -> frozenset[Role]:
        if self.roles.is_stale():
            try:
                listing = await self.peers.scheduler.ListWorkers(
                    scheduler_pb.ListWorkersRequest(), timeout=deadline.remaining())
            except grpc.aio.AioRpcError as e:
                raise from_rpc_error(e) from None
            self.roles.update(listing)
        return self.roles.roles(model)

    async def _prompt(self, token_ids: list[int], stage: EncodeStage, plan: Plan,
                      grids: list[multimodal_pb2.ImageGrid],
                      deadline: Deadline) -> generation_pb2.Prompt:  # fmt: skip
        if not plan.uses_encoders:
            images = [multimodal_pb2.ImageInput(mm_hash=item.mm_hash, media=item)
                      for item in stage.items]  # fmt: skip
            return generation_pb2.Prompt(token_ids=token_ids, images=images)
        await encode_all(self.peers, stage, deadline)
        span = trace.get_current_span()
        span.set_attribute("epd.encoder_ids", sorted(stage.encoder_ids))
        span.set_attribute("epd.cache_hits", sum(r.cache_hit for r in stage.results.values()))
        span.set_attribute("epd.embedding_bytes",
                           sum(r.embeddings.byte_size for r in stage.results.values()))
        images = []
        for index, grid in enumerate(grids):
            result = stage.results[index]
            images.append(multimodal_pb2.ImageInput(
                mm_hash=result.mm_hash, grid=result.grid if result.HasField("grid") else grid,
                embeddings=result.embeddings))  # fmt: skip
        return generation_pb2.Prompt(token_ids=token_ids, images=images)

    def _block_hashes(self, token_ids: list[int], items: list[Media],
                      grids: list[multimodal_pb2.ImageGrid]) -> list[int]:  # fmt: skip
        return self.prompts.block_hashes(token_ids, [
            (item.mm_hash, self.grids.num_tokens((grid.t, grid.h, grid.w)))
            for item, grid in zip(items, grids, strict=True)])  # fmt: skip


def _with_hash(media: Media, mm_hash: str) -> Media:
    # NOTE: copied, not rebuilt from url= and data=: setting both members of the oneof (one
    # empty) would keep only the last, dropping a data: URL.
    item = multimodal_pb2.MediaItem()
    item.CopyFrom(media)
    item.mm_hash = mm_hash
    return item
