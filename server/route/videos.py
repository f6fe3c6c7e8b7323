"""A request's videos at the route: loaded once, cut into chunks, and joined again (no grpc).

Each video is decoded and planned once here (``VideoLoader``: the model's video processor
settings choose the frames, the size and the grid), so everything that shapes the prompt is
fixed before any encoder runs. Its kept frames are then cut at temporal-patch boundaries into
chunks of ``patches_per_chunk`` temporal patches, each an encoding item of its own, named by its
content hash: the scheduler assigns chunks to encoders as it assigns images (weighted by their
tokens), so one clip is encoded by several encoders at once, and a repeated or overlapping clip
finds its chunks in the encoders' caches. The prefill worker gets the chunks' embeddings in order
as one video (``VideoInput``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from epd.server.media.hashing import salted
from epd.server.media.video import check_num_videos, check_video_tokens
from epd.server.media.video_hashing import VideoChunk
from epd.server.media.video_loader import VideoLoader
from epd.server.media.video_planner import PlannedVideo
from epd.server.route.request import ImageSource
from epd.v1 import encode_service_pb2 as encode_pb
from epd.v1 import multimodal_pb2

#: temporal patches in one chunk by default (--video-chunk-patches)
DEFAULT_CHUNK_PATCHES = 8


@dataclass(frozen=True, slots=True)
class RouteVideo:
    """One video of a request as the route loaded it: its planned frames, and one encoding
    item per chunk (``items[i]`` encodes ``chunks[i]``; their source is the whole video)."""

    video: PlannedVideo
    chunks: list[VideoChunk]
    items: list[multimodal_pb2.MediaItem]

    @property
    def chunk_tokens(self) -> list[int]:
        """Embedding rows of each chunk."""
        per_patch = self.video.plan.tokens_per_temporal_patch
        return [chunk.num_patches * per_patch for chunk in self.chunks]


async def load_videos(
    loader: VideoLoader, sources: list[ImageSource], patches_per_chunk: int
) -> list[RouteVideo]:
    """``sources`` each loaded and cut into chunks (``load_video``), within the media policy's
    count of videos and their tokens together (InvalidArgument ``TOO_MANY_VIDEOS``,
    ``TOO_MANY_VIDEO_TOKENS``)."""
    check_num_videos(len(sources), loader.policy)
    videos = await asyncio.gather(*(load_video(loader, s, patches_per_chunk) for s in sources))
    check_video_tokens([video.video.plan.num_tokens for video in videos], loader.policy)
    return list(videos)


async def load_video(
    loader: VideoLoader, source: ImageSource, patches_per_chunk: int
) -> RouteVideo:
    """``source`` decoded, planned and cut into chunks of ``patches_per_chunk`` patches."""
    video = await loader.load(url=source.url, data=source.data)
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
            ),
            **({"url": source.url} if source.url else {"data": source.data}),
        )
        for chunk in chunks
    ]
    return RouteVideo(video, chunks, items)


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
