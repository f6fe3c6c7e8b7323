"""The route's logic: one chat request through encode, prefill and decode, streamed back.

One path per request, each step a function of what the steps before it made:
1. prompt: render and tokenise the chat (``prompt``);
2. media: load every image under the media rules: decoded, hashed (mm_hash) and its grid and
   token count computed once here, for every later hop (``media.RouteImage``); with a data
   plane its decoded pixels are shared with the workers on this host that read images
   (encoders, an encode_prefill worker), in segments tagged with its mm_hash, so none of them
   decodes or hashes it again; every video decoded, planned and cut into chunks once here
   (``media.RouteVideo``), each chunk an encoding item whose frames are shared likewise; the
   prompt as the engine will hold it (block hashes, a requested cut, the embedded prompt)
   follows from those counts (``engine_prompt``), and one beyond the model's context is
   refused as its block hashes are computed, before anything is encoded;
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
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from functools import partial

from opentelemetry import trace

from epd.common.roles import known_role
from epd.server.media.grid import ImageGridder
from epd.server.media.loader import MediaLoader
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
from epd.server.route.engine_prompt import block_hashes, embedded, expanded, truncated
from epd.server.route.hops import EngineCall, Piece, place, stream_tokens
from epd.server.route.media import (
    DEFAULT_CHUNK_PATCHES,
    RouteImage,
    RouteVideo,
    in_namespace,
    load_images,
    load_videos,
    raw_prompt,
    stage_items,
)
from epd.server.route.metrics import RouteMetrics
from epd.server.route.peers import Peers
from epd.server.route.prompt import PromptBuilder, Rendered
from epd.server.route.request import ChatRequest, Deadline, ImageSource
from epd.server.route.resumption import DEFAULT_MAX_RESUMPTIONS
from epd.server.route.topology import plan_for
from epd.server.transfer.plane import DataPlane
from epd.v1 import generation_pb2
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
    # asked for it (``ChatRequest.return_token_ids``) or its reasoning parser reads it (None:
    # neither, or a later chunk)
    prompt_token_ids: list[int] | None = None
    # on the first chunk, the chat template's text when the request asked for it
    # (``ChatRequest.return_prompt_text``; None: not asked, a prompt given as tokens, or a
    # later chunk)
    prompt_text: str | None = None


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
        self.roles = peers.roles

    async def generate(
        self, request: ChatRequest, timeout_s: float | None = None
    ) -> AsyncIterator[RouteChunk]:
        """Stream the answer to ``request`` (checked: ``request_check``), counted and timed in
        ``metrics``."""
        sources = request.images  # NOTE: a walk over the messages' parts: once a request
        if self.metrics is None:
            async for chunk in self.answer(request, sources, timeout_s):
                yield chunk
            return
        observation = self.metrics.observe(len(sources))
        try:
            async for chunk in self.answer(request, sources, timeout_s):
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

    async def answer(
        self, request: ChatRequest, sources: list[ImageSource], timeout_s: float | None
    ) -> AsyncIterator[RouteChunk]:
        """Stream the answer to ``request`` (its images ``sources``, read once by the caller),
        unobserved: ``generate`` observes a request, a beam search its steps as one."""
        deadline, model = Deadline(timeout_s), request.model or self.model_id
        trace.get_current_span().set_attribute("epd.request_id", request.request_id)
        video_sources = request.videos
        num_media = len(sources) + len(video_sources)
        roles = await self.roles.live_roles(
            model, self.model_id, self._list_workers, deadline, num_media
        )
        prompt = await self._prompt(request)
        token_ids = prompt.token_ids
        images, videos = await asyncio.gather(
            load_images(self.loader, self.grids, sources, request.media_kwargs),
            load_videos(
                self.videos,
                video_sources,
                self.video_chunk_patches,
                request.media_kwargs,
                has_images=bool(sources),
                video_tokens=self.prompts.video_tokens,
            ),
        )
        if request.truncate_prompt_tokens is not None:
            token_ids = truncated(self.prompts, request, token_ids, images, videos)
        token_ids = token_ids + request.answer_prefix  # NOTE: a beam's step: its tokens so far
        param = "messages" if request.prompt_token_ids is None else "prompt"
        sampling, salt = request.sampling, ""
        if request.tenant or sampling.cache_salt:  # NOTE: else one namespace, keys unchanged
            sampling, salt = in_namespace(request, images, videos)
        call = EngineCall(
            request.request_id,
            model,
            generation_pb2.Prompt(token_ids=token_ids),
            sampling,
            block_hashes(self.prompts, token_ids, images, videos, salt, param),
            plan_for(roles, num_media),
            deadline,
        )
        items, pixels = stage_items(call.plan.uses_encoders, images, videos)
        stage = EncodeStage(
            request.request_id,
            model,
            items,
            request.encoder_policy,
            num_tokens=[image.num_tokens for image in images]
            + [tokens for v in videos for tokens in v.chunk_tokens],
        )
        try:
            share_pixels(self.plane, stage, pixels)
            pieces = self._engine_pieces(call, stage, images, videos)
            parsing = request.answer_parsing  # NOTE: a reasoning parser reads the prompt too
            asked = request.return_token_ids or (parsing is not None and parsing.needs_prompt)
            prompt_ids = expanded(self.prompts, token_ids, images, videos) if asked else None
            async for chunk in self._chunks(pieces, call.sampling, prompt_ids, prompt.text):
                yield chunk
        finally:
            await self._release(stage)

    async def _release(self, stage: EncodeStage) -> None:
        """Let go of what a request held once it ends, however it ends: its pixels, its
        embeddings' leases on the encoders (shielded from the request's cancellation), and
        count its retried encodings."""
        if self.metrics is not None and stage.num_retried:
            self.metrics.encode_retries.inc(stage.num_retried)
        await asyncio.shield(release_all(self.peers, stage, self.plane))

    async def _chunks(
        self,
        pieces: AsyncGenerator[Piece, None],
        sampling: generation_pb2.SamplingParams,
        prompt_ids: list[int] | None = None,
        prompt_text: str | None = None,
    ) -> AsyncIterator[RouteChunk]:
        """The engine's pieces as text deltas, stop strings applied as vLLM applies them, the
        first with ``prompt_ids`` and ``prompt_text`` (None: not asked)."""
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
                    prompt_text if is_first else None,
                )
                is_first = False

    async def _engine_pieces(
        self,
        call: EngineCall,
        stage: EncodeStage,
        images: list[RouteImage],
        videos: Sequence[RouteVideo] = (),
    ) -> AsyncGenerator[Piece, None]:
        """The engine's tokens. With encoders: the request placed (encoders, prefill worker,
        decode worker), then streamed with the embeddings' references for each attempt's prefill
        worker (``prompt_for``). Else: streamed with the raw images and whole videos (``stage``'s
        items after the images are the videos' ``whole_video_item``). The leases go once it is
        prefilled."""

        async def prompt_for(chosen: scheduler_pb.PlaceResponse) -> generation_pb2.Prompt:
            # NOTE: the images encoded for the chosen prefill worker (the embeddings' consumer:
            # same host gets shared memory, another host NIXL; told its embeddings device too),
            # by the encoders the first attempt's Place named. A retry on another host, or a
            # resumption that finds them released, encodes again (the caches answer by mm_hash);
            # any reference is readable into any device.
            worker = chosen.prefill.worker
            host_id = worker.host_id or self.host_id
            if not stage.results or host_id != stage.consumer_host_id:
                if stage.encoder_ids:
                    logger.info(
                        "request %s: prefill on %s (host %s); encoding its images again for it",
                        call.request_id,
                        worker.id,
                        host_id,
                    )
                    await release_all(self.peers, stage, self.plane)
                stage.consumer_host_id, stage.consumer_device = host_id, worker.embeddings_device
                first = chosen.encoders if chosen.HasField("encoders") else None
                await encode_all(self.peers, stage, call.deadline, first)
                release_pixels(self.plane, stage)
            return embedded(call.prompt.token_ids, stage, images, videos)

        span = trace.get_current_span()
        span.set_attributes({"epd.images": len(images), "epd.videos": len(videos)})
        span.set_attribute("epd.encoder_policy", stage.policy)
        placement = None
        if call.plan.uses_encoders:
            items = encode_items(stage, list(range(len(stage.items))))
            placement = await place(self.peers, call, items, stage.policy)
        else:
            video_items = stage.items[len(images) :]
            raw = raw_prompt(call.prompt.token_ids, images, videos, video_items)
            call = replace(call, prompt=raw)
        pieces = stream_tokens(
            self.peers,
            call,
            partial(release_all, self.peers, stage, self.plane, read=True),
            placement,
            prompt_for if placement is not None else None,
            max_resumptions=self.max_resumptions,
            on_resumed=self._count_resumption,
        )
        async with aclosing(pieces):
            async for piece in pieces:
                yield piece

    async def _prompt(self, request: ChatRequest) -> Rendered:
        """The prompt's tokens (size checked first), with the chat template's text where the
        request asked for it (vLLM's return_prompt_text; none for tokens given as such); long
        chats are rendered off the loop."""
        if request.prompt_token_ids is not None:
            return Rendered(None, list(request.prompt_token_ids))
        messages, kwargs = request.messages, request.template_kwargs
        arguments = (messages, kwargs, request.chat_template, request.add_special_tokens)
        if self.prompts.num_chars(messages) <= INLINE_TOKENIZE_CHARS:
            rendered = self.prompts.render(*arguments)
        else:
            rendered = await asyncio.to_thread(self.prompts.render, *arguments)
        return rendered if request.return_prompt_text else Rendered(None, rendered.token_ids)

    def _count_resumption(self, role: str, num_sent: int) -> None:
        if self.metrics is not None:
            self.metrics.resumptions.labels(role=role).inc()

    async def _list_workers(self, timeout_s: float | None) -> scheduler_pb.ListWorkersResponse:
        return await self.peers.scheduler.ListWorkers(
            scheduler_pb.ListWorkersRequest(), timeout=timeout_s
        )
