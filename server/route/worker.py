"""The route's logic: one chat request through encode, prefill and decode, streamed back.

Order: load every image under the media rules (validation, mm_hash and grid, once per source),
render and tokenise the chat, pick the path from the roles live now (``topology``), have the
images encoded (scheduler assignment, concurrent encoders, retries elsewhere) or pass them raw to
an encode_prefill worker while the scheduler chooses the prefill worker (KV-aware, from the hashes
of the expanded prompt), stream the engine's tokens as text deltas (``hops``). Every embedding
lease is released at its encoder once the prompt has been prefilled, or when the request ends,
whatever happened. With a data plane, the route also hands each image's decoded pixels to the
encoders (shared memory on its host: an encoder there skips fetching and decoding), and frees
them when the request ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, defaultdict
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, replace
from functools import partial

import torch
from opentelemetry import trace

from epd.common.errors import EpdError, NotFound
from epd.common.roles import Role, known_role
from epd.common.tasks import concurrently
from epd.server.media.grid import ImageGridder
from epd.server.media.hashing import pixels_tag
from epd.server.media.loader import LoadedImage, MediaLoader
from epd.server.route.deadline import Deadline
from epd.server.route.detokenize import Detokenizer
from epd.server.route.encoding import EncodeStage, assign_encoders, encode_all, release_all
from epd.server.route.hops import EngineCall, Piece, PromptFor, choose_prefill, stream_tokens
from epd.server.route.metrics import RouteMetrics
from epd.server.route.peers import Peers
from epd.server.route.prompt import ChatPart, PromptBuilder
from epd.server.route.request_ids import ensure_request_id
from epd.server.route.resumption import DEFAULT_MAX_RESUMPTIONS
from epd.server.route.topology import Plan, RoleView, plan_for
from epd.server.transfer.plane import DataPlane
from epd.v1 import generation_pb2, multimodal_pb2, route_service_pb2, tensor_pb2
from epd.v1 import scheduler_service_pb2 as scheduler_pb

# Chats of up to this many text characters are tokenised on the event loop, where that costs
# less than a hand-off to a thread.
INLINE_TOKENIZE_CHARS = 4096
LIST_MODELS_TIMEOUT_S = 5.0
logger = logging.getLogger(__name__)

Chat = list[tuple[str, list[ChatPart]]]
Media = multimodal_pb2.MediaItem
Grid = multimodal_pb2.ImageGrid


@dataclass(frozen=True, slots=True)
class RouteChunk:
    """A piece of the answer."""

    text: str
    token_ids: list[int]
    finish_reason: int = 0
    usage: generation_pb2.Usage | None = None


class Router:
    """Runs requests for one model against the services the scheduler knows (the route's logic;
    not a worker: it registers with no scheduler)."""

    def __init__(
        self,
        peers: Peers,
        prompts: PromptBuilder,
        loader: MediaLoader,
        *,
        model_id: str,
        host_id: str,
        grids: ImageGridder,
        plane: DataPlane | None = None,
        metrics: RouteMetrics | None = None,
        max_resumptions: int = DEFAULT_MAX_RESUMPTIONS,
    ) -> None:
        """``plane``: where the decoded pixels of images go for the encoders (None: encoders
        load each image from its source again). ``metrics``: where requests are counted and
        timed (None: nowhere). ``max_resumptions``: how many times a request's stream may move
        to another replica when its worker fails mid-stream (``hops.stream_tokens``)."""
        self.max_resumptions = max_resumptions
        self.metrics = metrics
        self.plane = plane
        self.peers = peers
        self.prompts = prompts
        self.loader = loader
        self.model_id = model_id
        self.host_id = host_id
        self.grids = grids
        self.roles = RoleView()

    async def generate(
        self, request: route_service_pb2.GenerateRequest, timeout_s: float | None = None
    ) -> AsyncIterator[RouteChunk]:
        """Stream the answer to ``request``."""
        if self.metrics is None:
            async for chunk in self._answer(request, timeout_s):
                yield chunk
            return
        observation = self.metrics.observe(_num_images(request))
        try:
            async for chunk in self._answer(request, timeout_s):
                usage = chunk.usage
                observation.add(
                    len(chunk.token_ids), usage.prompt_tokens if usage is not None else 0
                )
                yield chunk
        except BaseException as e:
            observation.end(e)
            raise
        observation.end(None)

    async def list_models(self) -> dict[str, dict[str, int]]:
        """The models the scheduler's workers serve, each with its worker count by role
        (``Role.label``; ``unknown`` for a role this build does not know), sorted by model."""
        listing = await self.peers.scheduler.ListWorkers(
            scheduler_pb.ListWorkersRequest(), timeout=LIST_MODELS_TIMEOUT_S
        )
        counts: dict[str, Counter[str]] = defaultdict(Counter)
        for worker in listing.workers:
            role = known_role(worker.info.role)
            counts[worker.info.model][role.label if role is not None else "unknown"] += 1
        return {model: dict(roles) for model, roles in sorted(counts.items())}

    async def _answer(
        self, request: route_service_pb2.GenerateRequest, timeout_s: float | None
    ) -> AsyncIterator[RouteChunk]:
        deadline = Deadline(timeout_s)
        span = trace.get_current_span()
        request_id = ensure_request_id(request)
        model = request.model or self.model_id
        span.set_attribute("epd.request_id", request_id)
        live_roles = await self._live_roles(model, deadline)  # NOTE: an unknown model loads nothing
        messages, media = self._chat(request)
        token_ids = await self._token_ids(messages)
        loaded = await asyncio.gather(*(self.loader.load(url=m.url, data=m.data) for m in media))
        grids = [self._grid(image) for image in loaded]
        items = [_with_hash(m, image.mm_hash) for image, m in zip(loaded, media, strict=True)]
        plan = plan_for(live_roles, len(items))
        span.set_attribute("epd.images", len(items))
        span.set_attribute("epd.encoder_policy", int(request.encoder_policy))
        stage = EncodeStage(
            request_id,
            model,
            items,
            request.encoder_policy,
            consumer_host_id=self.host_id,
            num_tokens=[self.grids.num_tokens((g.t, g.h, g.w)) for g in grids],
        )
        call = EngineCall(
            request_id,
            model,
            generation_pb2.Prompt(token_ids=token_ids),
            request.sampling,
            self._block_hashes(token_ids, items, grids),
            plan,
            live_roles,
            deadline,
        )
        try:
            if plan.uses_encoders:
                await self._attach_pixels(items, loaded, stage.pixel_leases)
            pieces = self._handed_over(call, stage, grids)
            detokenizer = Detokenizer(self.prompts.tokenizer)
            is_first = True
            async with aclosing(pieces):
                async for piece in pieces:
                    yield RouteChunk(
                        detokenizer.add(piece.token_ids),
                        piece.token_ids,
                        piece.finish_reason,
                        piece.usage,
                    )
                    if is_first:
                        is_first = False
                        self._refresh_roles()
        finally:
            self._refresh_roles()
            self._release_pixels(stage)
            if self.metrics is not None and stage.num_retried:
                self.metrics.encode_retries.inc(stage.num_retried)
            await asyncio.shield(release_all(self.peers, stage))

    def _release_pixels(self, stage: EncodeStage) -> None:
        """Release the stage's pixel leases (once every image is encoded, or at the end)."""
        leases, stage.pixel_leases = stage.pixel_leases, []
        if leases and self.plane is not None:
            self.plane.release(leases)

    async def _attach_pixels(
        self, items: list[Media], loaded: Sequence[LoadedImage], leases: list[str]
    ) -> None:
        """Put the pixels of each of ``loaded`` into the data plane, tagged with the image's
        mm_hash (encoders trust them as that image, ``payload_layout``), and name them in its
        item; each lease goes into ``leases`` as soon as it exists (the caller releases them).
        Best effort: an image whose pixels cannot be put is sent by its source alone."""
        if self.plane is None:
            return
        for item, image in zip(items, loaded, strict=True):
            try:
                ref = self.plane.put(
                    torch.from_numpy(image.pixels),
                    self.plane.host_id,
                    preferred=tensor_pb2.TRANSFER_KIND_SHM,
                    content_tag=pixels_tag(image.mm_hash),
                )
            except (EpdError, OSError) as e:
                logger.debug(
                    "pixels of %s not shared (%s): encoders load the source", item.mm_hash, e
                )
                continue
            leases.append(ref.lease_id)
            item.pixels.CopyFrom(ref)

    async def _token_ids(self, messages: list[tuple[str, list[ChatPart]]]) -> list[int]:
        """The prompt's tokens (size checked first); long chats are tokenised off the loop."""
        if self.prompts.num_chars(messages) <= INLINE_TOKENIZE_CHARS:
            return self.prompts.token_ids(messages)
        return await asyncio.to_thread(self.prompts.token_ids, messages)

    async def _handed_over(
        self, call: EngineCall, stage: EncodeStage, grids: list[Grid]
    ) -> AsyncGenerator[Piece, None]:
        """Choose the prefill worker while the encoders are assigned, encode for that worker
        (the embeddings' consumer: same host gets shared memory, another host NIXL; told its
        embeddings device too), then hand the embeddings' references to it."""
        token_ids = list(call.prompt.token_ids)
        if not (call.plan.uses_encoders and stage.items):
            prompt, choice = await concurrently(
                self._prompt(token_ids, stage, call.plan, grids, call.deadline),
                choose_prefill(self.peers, call),
            )
        else:
            everything = list(range(len(stage.items)))
            assignment, choice = await concurrently(
                assign_encoders(self.peers, stage, everything, [], call.deadline),
                choose_prefill(self.peers, call),
            )
            self._set_consumer(stage, choice.worker)
            await encode_all(self.peers, stage, call.deadline, assignment)
            self._release_pixels(stage)
            prompt = self._embedded(token_ids, stage, grids)

            async def prompt_for(worker: scheduler_pb.WorkerInfo) -> generation_pb2.Prompt:
                # NOTE: only another host needs new references; any is readable into any device.
                # A resumption finds them released once its predecessor had prefilled.
                if not stage.results or (worker.host_id or self.host_id) != stage.consumer_host_id:
                    await self._encode_again_for(worker, stage, call.deadline)
                return self._embedded(token_ids, stage, grids)

            async for piece in self._stream(call, prompt, stage, choice, prompt_for):
                yield piece
            return
        async for piece in self._stream(call, prompt, stage, choice):
            yield piece

    def _set_consumer(self, stage: EncodeStage, worker: scheduler_pb.WorkerInfo) -> None:
        """Encode ``stage`` for ``worker``: its host, and the device it reads embeddings into."""
        stage.consumer_host_id = worker.host_id or self.host_id
        stage.consumer_device = worker.embeddings_device

    async def _encode_again_for(
        self, worker: scheduler_pb.WorkerInfo, stage: EncodeStage, deadline: Deadline
    ) -> None:
        """A retry moved the prefill to ``worker`` on another host, where the embeddings'
        references (shared memory on the old one) cannot be read, or a resumption needs them
        after they were released: release them and encode again for it (the encoders' caches
        answer by mm_hash)."""
        self._set_consumer(stage, worker)
        logger.info(
            "request %s: prefill on %s (host %s); encoding its images again for it",
            stage.request_id,
            worker.id,
            stage.consumer_host_id,
        )
        await release_all(self.peers, stage)
        await encode_all(self.peers, stage, deadline)

    def _stream(
        self,
        call: EngineCall,
        prompt: generation_pb2.Prompt,
        stage: EncodeStage,
        choice: scheduler_pb.ChoosePrefillResponse | None = None,
        prompt_for: PromptFor | None = None,
    ) -> AsyncGenerator[Piece, None]:
        """The engine's tokens for ``prompt``; the stage's leases go once it is prefilled."""
        release = partial(release_all, self.peers, stage, read=True)
        return stream_tokens(
            self.peers,
            replace(call, prompt=prompt),
            release,
            choice,
            prompt_for,
            max_resumptions=self.max_resumptions,
            on_resumed=self._count_resumption,
        )

    def _count_resumption(self, role: str, num_sent: int) -> None:
        if self.metrics is not None:
            self.metrics.resumptions.labels(role=role).inc()

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
        t, h, w = self.grids.grid_of_size(image.width, image.height)
        return multimodal_pb2.ImageGrid(t=t, h=h, w=w)

    async def _live_roles(self, model: str, deadline: Deadline) -> frozenset[Role]:
        await self.roles.ensure_fit(model, self._list_workers, deadline.remaining)
        served = self.roles.models() | {self.model_id}
        if model and model not in served:
            names = ", ".join(_shortened(name) for name in sorted(served))
            shown = _shortened(model)
            raise NotFound(
                f"model {shown!r} is not served here; served models: {names}",
                reason="MODEL_NOT_FOUND",
                metadata={"model": shown},
            )
        return self.roles.roles(model)

    def _refresh_roles(self) -> None:
        """Refresh a stale view of the roles, off the request's path: once the first token is
        out (or the request has ended)."""
        self.roles.refresh_in_background(self._list_workers, self.peers.background)

    async def _list_workers(self, timeout_s: float | None) -> scheduler_pb.ListWorkersResponse:
        return await self.peers.scheduler.ListWorkers(
            scheduler_pb.ListWorkersRequest(), timeout=timeout_s
        )

    async def _prompt(
        self,
        token_ids: list[int],
        stage: EncodeStage,
        plan: Plan,
        grids: list[multimodal_pb2.ImageGrid],
        deadline: Deadline,
    ) -> generation_pb2.Prompt:
        if not plan.uses_encoders:
            images = [
                multimodal_pb2.ImageInput(mm_hash=item.mm_hash, media=item) for item in stage.items
            ]
            return generation_pb2.Prompt(token_ids=token_ids, images=images)
        await encode_all(self.peers, stage, deadline)
        return self._embedded(token_ids, stage, grids)

    def _embedded(
        self, token_ids: Sequence[int], stage: EncodeStage, grids: list[Grid]
    ) -> generation_pb2.Prompt:
        """The prompt with the encoders' embedding references (every item encoded)."""
        span = trace.get_current_span()
        span.set_attribute("epd.encoder_ids", sorted(stage.encoder_ids))
        span.set_attribute("epd.cache_hits", sum(r.cache_hit for r in stage.results.values()))
        span.set_attribute(
            "epd.embedding_bytes", sum(r.embeddings.byte_size for r in stage.results.values())
        )
        images = []
        for index, grid in enumerate(grids):
            result = stage.results[index]
            images.append(
                multimodal_pb2.ImageInput(
                    mm_hash=result.mm_hash,
                    grid=result.grid if result.HasField("grid") else grid,
                    embeddings=result.embeddings,
                )
            )
        return generation_pb2.Prompt(token_ids=token_ids, images=images)

    def _block_hashes(
        self, token_ids: list[int], items: list[Media], grids: list[multimodal_pb2.ImageGrid]
    ) -> list[int]:
        return self.prompts.block_hashes(
            token_ids,
            [
                (item.mm_hash, self.grids.num_tokens((grid.t, grid.h, grid.w)))
                for item, grid in zip(items, grids, strict=True)
            ],
        )


def _num_images(request: route_service_pb2.GenerateRequest) -> int:
    return sum(part.WhichOneof("part") == "image" for m in request.messages for part in m.content)


def _shortened(name: str, limit: int = 64) -> str:
    """``name`` cut to ``limit`` characters for an error: a caller's string is not echoed whole."""
    return name if len(name) <= limit else f"{name[:limit]}..."


def _with_hash(media: Media, mm_hash: str) -> Media:
    # NOTE: copied, not rebuilt from url= and data=: setting both members of the oneof (one
    # empty) would keep only the last, dropping a data: URL.
    item = multimodal_pb2.MediaItem()
    item.CopyFrom(media)
    item.mm_hash = mm_hash
    return item
