"""A request's images and videos at the route: each loaded once, for every later hop (no grpc).

Each image is decoded and hashed (mm_hash) under the media rules (``MediaLoader``), and its grid
and token count computed once here (``RouteImage``), within the request's pixel budget
(``image_budget``), which its item carries to the encoder. Each video is decoded and planned
once here (``VideoLoader``: the model's video processor settings choose the frames, the size and
the grid) and its prompt tokens counted (``RouteVideo.tokens``), so everything that shapes the
prompt is fixed before any encoder runs. Its kept frames are then cut at temporal-patch
boundaries into chunks of ``patches_per_chunk`` temporal patches, each an encoding item of its
own, named by its content hash: the scheduler assigns chunks to encoders as it assigns images
(weighted by their tokens), so one clip is encoded by several encoders at once, and a repeated
or overlapping clip finds its chunks in the encoders' caches. The prefill worker gets the
chunks' embeddings in order as one video (``VideoInput``).

With a tenant or a cache_salt, every item's key moves into the tenant's namespace once, before
any hop sees it (``in_namespace``); with a data plane, each item's decoded pixels are shared with
the workers on this host that read them (``stage_items``).

Without a live encoder (EPD, EP/D), the items go raw to an encode_prefill worker, whose engine
runs its own vision tower, with the pixels the route decoded (``stage_items``, ``raw_prompt``).
Each image goes as its item (source, mm_hash, the route's shared pixels). Each video goes whole,
not cut into chunks: one item named by the video's hash, whose shared pixels are all its kept
frames (one lease), and the plan that shaped the prompt (grid, timing, the kept frames' indices),
so the worker's engine takes the frames as they are, neither decoded nor sampled again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from epd.common.errors import InvalidArgument
from epd.server.media.grid import ImageGridder
from epd.server.media.hashing import key_salt, salted, under_settings
from epd.server.media.image_settings import NO_IMAGE_SETTINGS, ImageSettings
from epd.server.media.loader import LoadedImage, MediaLoader
from epd.server.media.policy import MediaPolicy
from epd.server.media.video import check_num_videos, check_video_tokens
from epd.server.media.video_hashing import VideoChunk
from epd.server.media.video_loader import VideoLoader
from epd.server.media.video_overrides import (
    NO_KWARGS,
    MediaKwargs,
    VideoOverrides,
    check_trusted,
)
from epd.server.media.video_planner import PlannedVideo
from epd.server.models.video import VideoPlan
from epd.server.route.prompt import VideoTokens
from epd.server.route.request import ChatRequest, ImageSource
from epd.v1 import encode_service_pb2 as encode_pb
from epd.v1 import generation_pb2, multimodal_pb2

#: temporal patches in one chunk by default (--video-chunk-patches)
DEFAULT_CHUNK_PATCHES = 8
#: what a video's placeholder token expands to, from its plan (``PromptBuilder.video_tokens``)
VideoTokensOf = Callable[[VideoPlan], VideoTokens]


@dataclass(frozen=True, slots=True)
class RouteImage:
    """One image of a request as the route loaded it, each fact computed once: the item the
    workers get (source, mm_hash, shared pixels), its grid and its number of tokens."""

    item: multimodal_pb2.MediaItem
    loaded: LoadedImage
    grid: multimodal_pb2.ImageGrid
    num_tokens: int


@dataclass(frozen=True, slots=True)
class RouteVideo:
    """One video of a request as the route loaded it, each fact computed once: its planned
    frames, one encoding item per chunk (``items[i]`` encodes ``chunks[i]``; their source is
    the whole video) and what its placeholder token expands to in the engine's prompt
    (``PromptBuilder.video_tokens``), which the block hashes, a truncation and the expanded
    ids all take."""

    video: PlannedVideo
    chunks: list[VideoChunk]
    items: list[multimodal_pb2.MediaItem]
    tokens: VideoTokens

    @property
    def chunk_tokens(self) -> list[int]:
        """Embedding rows of each chunk."""
        per_patch = self.video.plan.tokens_per_temporal_patch
        return [chunk.num_patches * per_patch for chunk in self.chunks]


def image_budget(grids: ImageGridder, policy: MediaPolicy, kwargs: MediaKwargs) -> ImageSettings:
    """The pixel budget of a request's images under its ``kwargs`` (refused as vLLM refuses
    them unless the policy trusts them) merged over the server's (``ImageGridder.budget``)."""
    if kwargs == NO_KWARGS and not policy.mm_processor_kwargs:
        return NO_IMAGE_SETTINGS
    check_trusted(kwargs, policy.trust_request_mm_kwargs)
    server = MediaKwargs(policy.mm_processor_kwargs, policy.media_io_kwargs)
    return grids.budget(server, kwargs, policy.max_pixels)


async def load_images(
    loader: MediaLoader,
    grids: ImageGridder,
    sources: list[ImageSource],
    kwargs: MediaKwargs = NO_KWARGS,
) -> list[RouteImage]:
    """Each image loaded under the media rules, with its grid and token count resized within
    the pixel budget of the request's ``kwargs`` (``image_budget``, checked before any image
    loads), which its item carries and its mm_hash covers (``hashing.under_settings``)."""
    if not sources:
        return []
    settings = image_budget(grids, loader.policy, kwargs)
    loaded = await asyncio.gather(
        *(loader.load(url=source.url, data=source.data) for source in sources)
    )
    images = []
    for source, image in zip(sources, loaded, strict=True):
        t, h, w = grids.grid_of_size(image.width, image.height, settings)
        item = _media_item(source, under_settings(image.mm_hash, settings.key))
        item.image_settings = settings.key
        images.append(
            RouteImage(
                item,
                image,
                multimodal_pb2.ImageGrid(t=t, h=h, w=w),
                grids.num_tokens((t, h, w)),
            )
        )
    return images


async def load_videos(
    loader: VideoLoader | None,
    sources: list[ImageSource],
    patches_per_chunk: int,
    kwargs: MediaKwargs = NO_KWARGS,
    has_images: bool = False,
    *,
    video_tokens: VideoTokensOf,
) -> list[RouteVideo]:
    """``sources`` each loaded, cut into chunks and counted by ``video_tokens`` (``load_video``),
    within the media policy's count of videos and their tokens together (InvalidArgument
    ``TOO_MANY_VIDEOS``, ``TOO_MANY_VIDEO_TOKENS``), under the request's ``kwargs``
    (``VideoLoader.overrides``: checked in every request, videos or not; ``has_images``: it
    holds an image too); ``loader`` None: the model takes no video (``VIDEO_NOT_SUPPORTED`` when
    there is one)."""
    if not sources and kwargs == NO_KWARGS:
        return []
    overrides = loader.overrides(kwargs, has_images=has_images) if loader else None
    if not sources:
        return []
    if loader is None:
        raise InvalidArgument("this model takes no video", reason="VIDEO_NOT_SUPPORTED")
    check_num_videos(len(sources), loader.policy)
    videos = await asyncio.gather(
        *(load_video(loader, s, patches_per_chunk, video_tokens, overrides) for s in sources)
    )
    check_video_tokens([video.video.plan.num_tokens for video in videos], loader.policy)
    return list(videos)


async def load_video(
    loader: VideoLoader,
    source: ImageSource,
    patches_per_chunk: int,
    video_tokens: VideoTokensOf,
    overrides: VideoOverrides | None = None,
) -> RouteVideo:
    """``source`` decoded, planned (under ``overrides``; None: the server's), cut into chunks
    of ``patches_per_chunk`` patches, and its prompt tokens counted (``video_tokens``: the
    route's ``PromptBuilder.video_tokens``)."""
    video = await loader.load(url=source.url, data=source.data, overrides=overrides)
    chunks = loader.planner.chunks(video, patches_per_chunk)
    height, width = video.plan.resized
    items = [
        multimodal_pb2.MediaItem(
            mm_hash=chunk.content_hash,
            video=multimodal_pb2.VideoSpan(
                first_frame=chunk.frames.start,
                num_frames=len(chunk.frames),
                resized_height=height,
                resized_width=width,
                video_settings=video.overrides.key,
            ),
            **({"url": source.url} if source.url else {"data": source.data}),
        )
        for chunk in chunks
    ]
    return RouteVideo(video, chunks, items, video_tokens(video.plan))


def in_namespace(
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


def video_input(
    video: RouteVideo, results: list[encode_pb.EncodeResponse]
) -> multimodal_pb2.VideoInput:
    """The prefill worker's input for ``video`` from its chunks' encodings, in order."""
    plan = video.video.plan
    t, h, w = plan.grid
    return multimodal_pb2.VideoInput(
        # NOTE: a tenant's video is named by its salted hash, as its chunks (hashing.salted)
        mm_hash=salted(video.video.video_hash, video.items[0].key_salt if video.items else ""),
        grid=multimodal_pb2.ImageGrid(t=t, h=h, w=w),
        chunks=[result.embeddings for result in results],
        chunk_hashes=[result.mm_hash for result in results],
        seconds_per_temporal_patch=plan.seconds_per_temporal_patch or 0.0,
        timestamps=plan.timestamps or (),
    )


def _media_item(source: ImageSource, mm_hash: str) -> multimodal_pb2.MediaItem:
    """The item workers get for an image: its source (one member of the oneof: a data: URL is
    a url) and mm_hash."""
    if source.url:
        return multimodal_pb2.MediaItem(url=source.url, mm_hash=mm_hash)
    return multimodal_pb2.MediaItem(data=source.data, mm_hash=mm_hash)


def whole_video_item(video: RouteVideo) -> multimodal_pb2.MediaItem:
    """The item of the whole ``video``: its source, its hash (salted as its chunks are, with
    their ``key_salt``), a span of every kept frame at the plan's size."""
    first = video.items[0]
    salt = first.key_salt
    height, width = video.video.plan.resized
    span = multimodal_pb2.VideoSpan(
        num_frames=len(video.video.frames),
        resized_height=height,
        resized_width=width,
        video_settings=video.video.overrides.key,
    )
    item = multimodal_pb2.MediaItem(
        mm_hash=salted(video.video.video_hash, salt), key_salt=salt, video=span
    )
    if first.WhichOneof("source") == "url":
        item.url = first.url
    else:
        item.data = first.data
    return item


def stage_items(
    uses_encoders: bool, images: list[RouteImage], videos: list[RouteVideo]
) -> tuple[list[multimodal_pb2.MediaItem], list[tuple[multimodal_pb2.MediaItem, np.ndarray]]]:
    """A request's items, and each one with its decoded pixels to share: its images, then with
    encoders its videos' chunks (each chunk's kept frames), else each video's
    ``whole_video_item`` with all its kept frames."""
    pixels = [(image.item, image.loaded.pixels) for image in images]
    if uses_encoders:
        pixels += [
            (item, video.video.frames[chunk.frames.start : chunk.frames.stop])
            for video in videos
            for chunk, item in zip(video.chunks, video.items, strict=True)
        ]
    else:
        for video in videos:
            video.video.check_whole()
        pixels += [(whole_video_item(video), video.video.frames) for video in videos]
    return [item for item, _ in pixels], pixels


def raw_prompt(
    token_ids: Sequence[int],
    images: Sequence[RouteImage],
    videos: Sequence[RouteVideo],
    video_items: Sequence[multimodal_pb2.MediaItem],
) -> generation_pb2.Prompt:
    """The prompt with raw images and videos (``video_items``: each video's
    ``whole_video_item``, as ``stage_items`` made them)."""
    inputs = [multimodal_pb2.ImageInput(mm_hash=i.item.mm_hash, media=i.item) for i in images]
    raw_videos = [raw_video_input(v, i) for v, i in zip(videos, video_items, strict=True)]
    return generation_pb2.Prompt(token_ids=token_ids, images=inputs, videos=raw_videos)


def raw_video_input(video: RouteVideo, item: multimodal_pb2.MediaItem) -> multimodal_pb2.VideoInput:
    """The encode_prefill worker's input for ``video`` (``item``: its ``whole_video_item``)."""
    plan, stream = video.video.plan, video.video.stream
    t, h, w = plan.grid
    return multimodal_pb2.VideoInput(
        mm_hash=item.mm_hash,
        grid=multimodal_pb2.ImageGrid(t=t, h=h, w=w),
        seconds_per_temporal_patch=plan.seconds_per_temporal_patch or 0.0,
        timestamps=plan.timestamps or (),
        media=item,
        fps=stream.fps,
        num_decoded_frames=stream.num_frames,
        frame_indices=plan.frame_indices,
    )
