"""The route's logic: one chat request through encode, prefill and decode, streamed back.

One path per request, each step a function of what the steps before it made:
1. prompt: render and tokenise the chat (``prompt``);
2. media: load every image under the media rules: decoded, hashed (mm_hash) and its grid and
   token count computed once here, for every later hop (``RouteImage``); with a data plane its
   decoded pixels are shared with the workers on this host that read images (encoders, an
   encode_prefill worker), in segments tagged with its mm_hash, so none of them decodes or
   hashes it again; every video decoded, planned and cut into chunks once here
   (``videos``), each chunk an encoding item whose frames are shared likewise;
3. encoding: with live encoders, the scheduler assigns them while it chooses the prefill worker
   (KV-aware, from the hashes of the expanded prompt), and the images are encoded for that
   worker's host and device (``encoding``); without, the images go raw to an encode_prefill
   worker (``topology``);
4. prefill and decode: the engine hops stream the tokens, retried or resumed elsewhere when a
   worker fails (``hops``), as text deltas.
Every embedding lease and pixel lease is released once the prompt has been prefilled, or when the
request ends, whatever happened.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, defaultdict
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field, replace

import numpy as np
from opentelemetry import trace

from epd.common.errors import FailedPrecondition, InvalidArgument, NotFound
from epd.common.roles import Role, known_role
from epd.server.media.grid import ImageGridder
from epd.server.media.hashing import key_salt, salted
from epd.server.media.loader import LoadedImage, MediaLoader
from epd.server.media.video_loader import VideoLoader
from epd.server.route.detokenize import StoppedText
from epd.server.route.encoding import (
    EncodeStage,
    encode_all,
    encode_items,
    release_all,
    release_pixels,
    share_pixels,
)
from epd.server.route.hops import (
    EngineCall,
    OnPrefilled,
    Piece,
    PromptFor,
    place,
    stream_tokens,
)
from epd.server.route.metrics import RouteMetrics
from epd.server.route.peers import Peers
from epd.server.route.prompt import PromptBuilder
from epd.server.route.request import ChatRequest, Deadline, ImageSource
from epd.server.route.resumption import DEFAULT_MAX_RESUMPTIONS
from epd.server.route.topology import RoleView, plan_for
from epd.server.route.videos import DEFAULT_CHUNK_PATCHES, RouteVideo, load_videos, video_input
from epd.server.transfer.plane import DataPlane
from epd.v1 import generation_pb2, multimodal_pb2
from epd.v1 import scheduler_service_pb2 as scheduler_pb

# Chats of up to this many text characters are tokenised on the event loop, where that costs
# less than a hand-off to a thread.
INLINE_TOKENIZE_CHARS = 4096
LIST_MODELS_TIMEOUT_S = 5.0
logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RouteChunk:
    """A piece of the answer."""

    text: str
    token_ids: list[int]
    finish_reason: int = 0
    usage: generation_pb2.Usage | None = None
    # one entry per token when the sampling asked for log probabilities
    logprobs: list[generation_pb2.TokenLogprobs] = field(default_factory=list)
    # on the first chunk, one entry per prompt token when the sampling asked for them (the
    # first position without candidates)
    prompt_logprobs: list[generation_pb2.TokenLogprobs] = field(default_factory=list)
    # on the first chunk, the prompt as the engine holds it, images expanded, when the request
    # asked for it (``ChatRequest.return_token_ids``; None: not asked, or a later chunk)
    prompt_token_ids: list[int] | None = None


@dataclass(frozen=True, slots=True)
class RouteImage:
    """One image of a request as the route loaded it, each fact computed once: the item the
    workers get (source, mm_hash, shared pixels), its grid and its number of tokens."""

    item: multimodal_pb2.MediaItem
    loaded: LoadedImage
    grid: multimodal_pb2.ImageGrid
    num_tokens: int


class Router:
    """Runs requests for one model against the services the scheduler knows."""

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
        videos: VideoLoader | None = None,
        video_chunk_patches: int = DEFAULT_CHUNK_PATCHES,
    ) -> None:
        """``plane``: where the decoded pixels of images go for the workers on this host (None:
        they load each image from its source again). ``metrics``: where requests are counted
        and timed (None: nowhere). ``max_resumptions``: how many times a request's stream may
        move to another replica when its worker fails mid-stream (``hops.stream_tokens``).
        ``videos``: loads the model's videos (None: videos are refused, VIDEO_NOT_SUPPORTED);
        ``video_chunk_patches``: temporal patches in one chunk of a video, each chunk encoded
        as an item of its own."""
        self.videos = videos
        self.video_chunk_patches = video_chunk_patches
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
        self, request: ChatRequest, timeout_s: float | None = None
    ) -> AsyncIterator[RouteChunk]:
        """Stream the answer to ``request`` (checked: ``request_check.check_request``)."""
        if self.metrics is None:
            async for chunk in self._answer(request, timeout_s):
                yield chunk
            return
        observation = self.metrics.observe(len(request.images))
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
        self, request: ChatRequest, timeout_s: float | None
    ) -> AsyncIterator[RouteChunk]:
        deadline = Deadline(timeout_s)
        model = request.model or self.model_id
        span = trace.get_current_span()
        span.set_attribute("epd.request_id", request.request_id)
        live_roles = await self._live_roles(model, deadline)  # NOTE: an unknown model loads nothing
        token_ids = await self._token_ids(request)
        images, videos = await asyncio.gather(
            self._load(request.images), self._load_videos(request.videos)
        )
        if request.truncate_prompt_tokens is not None:
            token_ids = self._truncated(request, token_ids, images, videos)
        sampling, salt = request.sampling, ""
        if request.tenant or sampling.cache_salt:  # NOTE: else one namespace, keys unchanged
            sampling, salt = _in_namespace(request, images, videos)
        call = EngineCall(
            request.request_id,
            model,
            generation_pb2.Prompt(token_ids=token_ids),
            sampling,
            self._block_hashes(token_ids, images, videos, salt),
            plan_for(live_roles, len(images) + len(videos)),
            live_roles,
            deadline,
        )
        if videos and not call.plan.uses_encoders:
            raise FailedPrecondition(
                "videos are encoded by encode workers, and none is live for this model",
                reason="NO_VIDEO_ENCODER",
            )
        stage = EncodeStage(
            request.request_id,
            model,
            [image.item for image in images] + [item for v in videos for item in v.items],
            request.encoder_policy,
            consumer_host_id=self.host_id,
            num_tokens=[image.num_tokens for image in images]
            + [tokens for v in videos for tokens in v.chunk_tokens],
        )
        span.set_attribute("epd.images", len(images))
        span.set_attribute("epd.videos", len(videos))
        span.set_attribute("epd.encoder_policy", request.encoder_policy)
        try:
            share_pixels(self.plane, stage, _pixels_of(images, videos))
            pieces = self._engine_pieces(call, stage, images, videos)
            prompt_ids = None
            if request.return_token_ids:
                prompt_ids = self._engine_prompt(token_ids, images, videos)
            async for chunk in self._chunks(pieces, call.sampling, prompt_ids):
                yield chunk
        finally:
            self._refresh_roles()
            release_pixels(self.plane, stage)
            if self.metrics is not None and stage.num_retried:
                self.metrics.encode_retries.inc(stage.num_retried)
            await asyncio.shield(release_all(self.peers, stage))

    async def _chunks(
        self,
        pieces: AsyncGenerator[Piece, None],
        sampling: generation_pb2.SamplingParams,
        prompt_ids: list[int] | None = None,
    ) -> AsyncIterator[RouteChunk]:
        """The engine's pieces as text deltas, stop strings applied as vLLM applies them, the
        first with ``prompt_ids`` (None: not asked); the view of the roles is refreshed once the
        first is out (off the request's path)."""
        text_of = StoppedText(self.prompts.tokenizer, sampling)
        is_first = True
        async with aclosing(pieces):
            async for piece in pieces:
                is_stopped = piece.finish_reason == generation_pb2.FINISH_REASON_STOP
                text = text_of.add(piece.token_ids, is_stopped)
                yield RouteChunk(
                    text,
                    piece.token_ids,
                    piece.finish_reason,
                    piece.usage,
                    piece.logprobs,
                    piece.prompt_logprobs,
                    prompt_ids if is_first else None,
                )
                if is_first:
                    is_first = False
                    self._refresh_roles()

    async def _load(self, sources: list[ImageSource]) -> list[RouteImage]:
        """Each image loaded under the media rules, with its grid and token count."""
        loaded = await asyncio.gather(
            *(self.loader.load(url=source.url, data=source.data) for source in sources)
        )
        images = []
        for source, image in zip(sources, loaded, strict=True):
            t, h, w = self.grids.grid_of_size(image.width, image.height)
            images.append(
                RouteImage(
                    _media_item(source, image.mm_hash),
                    image,
                    multimodal_pb2.ImageGrid(t=t, h=h, w=w),
                    self.grids.num_tokens((t, h, w)),
                )
            )
        return images

    async def _load_videos(self, sources: list[ImageSource]) -> list[RouteVideo]:
        """Each video decoded, planned and cut into chunks under the media rules."""
        if not sources:
            return []
        if self.videos is None:
            raise InvalidArgument("this model takes no video", reason="VIDEO_NOT_SUPPORTED")
        return await load_videos(self.videos, sources, self.video_chunk_patches)

    def _engine_pieces(
        self,
        call: EngineCall,
        stage: EncodeStage,
        images: list[RouteImage],
        videos: Sequence[RouteVideo] = (),
    ) -> AsyncGenerator[Piece, None]:
        """The engine's tokens: with encoders, once the images and videos are encoded for the
        chosen prefill worker; else for the raw images (if any). The leases go once it is
        prefilled."""

        async def prefilled() -> None:
            release_pixels(self.plane, stage)
            await release_all(self.peers, stage, read=True)

        if call.plan.uses_encoders:
            return self._encoded_pieces(call, stage, images, videos, prefilled)
        raw = [multimodal_pb2.ImageInput(mm_hash=i.item.mm_hash, media=i.item) for i in images]
        prompt = generation_pb2.Prompt(token_ids=call.prompt.token_ids, images=raw)
        return self._stream(replace(call, prompt=prompt), prefilled)

    async def _encoded_pieces(
        self,
        call: EngineCall,
        stage: EncodeStage,
        images: list[RouteImage],
        videos: Sequence[RouteVideo],
        prefilled: OnPrefilled,
    ) -> AsyncGenerator[Piece, None]:
        """Place the request (encoders, prefill worker, decode worker), encode for that worker
        (the embeddings' consumer: same host gets shared memory, another host NIXL; told its
        embeddings device too), then stream with the embeddings' references for it."""
        items = encode_items(stage, list(range(len(stage.items))))
        placement = await place(self.peers, call, items, stage.policy)
        self._set_consumer(stage, placement.prefill.worker)
        await encode_all(self.peers, stage, call.deadline, placement.encoders)
        release_pixels(self.plane, stage)

        async def prompt_for(worker: scheduler_pb.WorkerInfo) -> generation_pb2.Prompt:
            # NOTE: only another host needs new references; any is readable into any device.
            # A resumption finds them released once its predecessor had prefilled.
            if not stage.results or (worker.host_id or self.host_id) != stage.consumer_host_id:
                await self._encode_again_for(worker, stage, call.deadline)
            return self._embedded(call.prompt.token_ids, stage, images, videos)

        async for piece in self._stream(call, prefilled, placement, prompt_for):
            yield piece

    def _stream(
        self,
        call: EngineCall,
        prefilled: OnPrefilled,
        placement: scheduler_pb.PlaceResponse | None = None,
        prompt_for: PromptFor | None = None,
    ) -> AsyncGenerator[Piece, None]:
        return stream_tokens(
            self.peers,
            call,
            prefilled,
            placement,
            prompt_for,
            max_resumptions=self.max_resumptions,
            on_resumed=self._count_resumption,
        )

    async def _token_ids(self, request: ChatRequest) -> list[int]:
        """The prompt's tokens (size checked first); long chats are tokenised off the loop."""
        if request.prompt_token_ids is not None:
            return list(request.prompt_token_ids)
        messages, kwargs = request.messages, request.template_kwargs
        arguments = (messages, kwargs, request.chat_template, request.add_special_tokens)
        if self.prompts.num_chars(messages) <= INLINE_TOKENIZE_CHARS:
            return self.prompts.token_ids(*arguments)
        return await asyncio.to_thread(self.prompts.token_ids, *arguments)

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

    def _count_resumption(self, role: str, num_sent: int) -> None:
        if self.metrics is not None:
            self.metrics.resumptions.labels(role=role).inc()

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

    def _embedded(
        self,
        token_ids: Sequence[int],
        stage: EncodeStage,
        images: list[RouteImage],
        videos: Sequence[RouteVideo],
    ) -> generation_pb2.Prompt:
        """The prompt with the encoders' embedding references (every item encoded)."""
        span = trace.get_current_span()
        span.set_attribute("epd.encoder_ids", sorted(stage.encoder_ids))
        span.set_attribute("epd.cache_hits", sum(r.cache_hit for r in stage.results.values()))
        span.set_attribute(
            "epd.embedding_bytes", sum(r.embeddings.byte_size for r in stage.results.values())
        )
        inputs = []
        for index, image in enumerate(images):
            result = stage.results[index]
            inputs.append(
                multimodal_pb2.ImageInput(
                    mm_hash=result.mm_hash,
                    grid=result.grid if result.HasField("grid") else image.grid,
                    embeddings=result.embeddings,
                )
            )
        video_inputs, index = [], len(images)
        for video in videos:
            results = [stage.results[index + i] for i in range(len(video.items))]
            video_inputs.append(video_input(video, results))
            index += len(video.items)
        return generation_pb2.Prompt(token_ids=token_ids, images=inputs, videos=video_inputs)

    def _engine_prompt(
        self, token_ids: list[int], images: list[RouteImage], videos: list[RouteVideo]
    ) -> list[int]:
        """The prompt's token ids as the engine holds them, each image and video expanded."""
        image_tokens = [image.num_tokens for image in images]
        video_tokens = [v.video.plan.num_tokens for v in videos]
        return self.prompts.expanded_ids(token_ids, image_tokens, video_tokens)

    def _truncated(
        self,
        request: ChatRequest,
        token_ids: list[int],
        images: list[RouteImage],
        videos: list[RouteVideo],
    ) -> list[int]:
        """The prompt cut to the request's ``truncate_prompt_tokens``, as vLLM cuts it."""
        assert request.truncate_prompt_tokens is not None
        image_tokens = [image.num_tokens for image in images]
        video_tokens = [v.video.plan.num_tokens for v in videos]
        keep, side = request.truncate_prompt_tokens, request.truncation_side
        return self.prompts.truncated(token_ids, keep, side, image_tokens, video_tokens)

    def _block_hashes(
        self,
        token_ids: list[int],
        images: list[RouteImage],
        videos: list[RouteVideo],
        salt: str = "",
    ) -> list[int]:
        return self.prompts.block_hashes(
            token_ids,
            [(image.item.mm_hash, image.num_tokens) for image in images],
            [(salted(v.video.video_hash, salt), v.video.plan.num_tokens) for v in videos],
            salt,
        )


def _in_namespace(
    request: ChatRequest, images: list[RouteImage], videos: list[RouteVideo]
) -> tuple[generation_pb2.SamplingParams, str]:
    """Move the request's keys into its tenant's namespace (``hashing.key_salt`` of its caller
    and cache_salt), once, before any hop sees them: each item's mm_hash salted (the key of
    the pixels' tag, the encoders' caches, the store and vLLM's caches), and the sampling
    given the salt as vLLM's cache_salt; each item carries the salt for an encoder that hashes
    its source itself. Returns that sampling and the salt."""
    salt = key_salt(request.tenant, request.sampling.cache_salt)
    for item in [image.item for image in images] + [i for v in videos for i in v.items]:
        item.mm_hash, item.key_salt = salted(item.mm_hash, salt), salt
    sampling = generation_pb2.SamplingParams()
    sampling.CopyFrom(request.sampling)
    sampling.cache_salt = salt
    return sampling, salt


def _shortened(name: str, limit: int = 64) -> str:
    """``name`` cut to ``limit`` characters for an error: a caller's string is not echoed whole."""
    return name if len(name) <= limit else f"{name[:limit]}..."


def _pixels_of(
    images: list[RouteImage], videos: list[RouteVideo]
) -> Iterator[tuple[multimodal_pb2.MediaItem, np.ndarray]]:
    """Each item's decoded pixels: an image's, then each video chunk's kept frames."""
    for image in images:
        yield image.item, image.loaded.pixels
    for video in videos:
        for chunk, item in zip(video.chunks, video.items, strict=True):
            yield item, video.video.frames[chunk.frames.start : chunk.frames.stop]


def _media_item(source: ImageSource, mm_hash: str) -> multimodal_pb2.MediaItem:
    """The item workers get for an image: its source (one member of the oneof: a data: URL is
    a url) and mm_hash."""
    if source.url:
        return multimodal_pb2.MediaItem(url=source.url, mm_hash=mm_hash)
    return multimodal_pb2.MediaItem(data=source.data, mm_hash=mm_hash)
