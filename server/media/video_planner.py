"""Videos for one model: decoded once, sampled, planned and named before any encoder runs.

``VideoPlanner`` reads the model's family and video processor once; ``load`` decodes a video's
bytes under the media policy, lets the family's video processor settings choose the frames
(``ModelFamily.plan_video``) and returns them with their plan and identity, all the route needs
to build the prompt and hand the frames on. A family's refusal becomes a clear error (400).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from epd.common.errors import InvalidArgument
from epd.server.media.policy import MediaPolicy
from epd.server.media.video import VideoStream, decode_video
from epd.server.media.video_hashing import (
    VideoChunk,
    chunk_hashes,
    video_hash,
    video_processor_fingerprint,
)
from epd.server.media.video_overrides import NO_OVERRIDES, VideoOverrides
from epd.server.models.video import VideoClip, VideoPlan, VideoRefused, with_settings


@dataclass(frozen=True, slots=True)
class PlannedVideo:
    """A decoded video: what decoding found (``stream``), the family's ``plan``, the kept
    ``frames`` (uint8 [len(plan.frame_indices), height, width, 3]), the video's hash and the
    ``overrides`` of the model's settings it was planned under."""

    stream: VideoStream
    plan: VideoPlan
    frames: np.ndarray
    video_hash: str
    overrides: VideoOverrides = NO_OVERRIDES

    def check_whole(self) -> None:
        """Refuse to hand this video whole to a worker that runs vLLM's own processor (no
        encoders) when it was planned under another pixel budget: that processor resizes with
        the model's settings (MEDIA_KWARGS_NOT_SUPPORTED)."""
        if self.overrides.changes_pixels:
            raise InvalidArgument(
                "a video's pixel budget (min_pixels, max_pixels, size, cap_pixels_per_frame) "
                "needs encode workers; an encode_prefill worker's engine resizes the frames "
                "with the model's own settings",
                reason="MEDIA_KWARGS_NOT_SUPPORTED",
                metadata={"param": "mm_processor_kwargs"},
            )


class VideoPlanner:
    """Plans and identities of videos for the model in ``model_dir`` (named ``model_id`` in
    hashes). Cheap per video beyond decoding; safe to share between threads."""

    def __init__(self, model_dir: str | Path, model_id: str) -> None:
        from transformers import AutoConfig

        from epd.server.models.registry import family_of

        self.family = family_of(model_dir)
        self.model_dir = model_dir
        self.model_id = model_id
        self.config: Any = AutoConfig.from_pretrained(model_dir)
        self.processor: Any = video_processor(model_dir)
        self.fingerprint = video_processor_fingerprint(model_dir)

    def load(
        self, data: bytes, policy: MediaPolicy, overrides: VideoOverrides = NO_OVERRIDES
    ) -> PlannedVideo:
        """Decode ``data`` under ``policy`` and keep the frames the model's sampling picks,
        with ``overrides`` of its settings (a request's or the server's)."""
        plans: list[VideoPlan] = []

        def choose(stream: VideoStream) -> tuple[int, ...]:
            plans.append(check_resized(self.plan(stream, overrides), policy))
            return plans[0].frame_indices

        decoded = decode_video(data, policy, choose)
        plan = plans[0]
        identity = video_hash(
            decoded.frames, plan, model_id=self.model_id, fingerprint=self.fingerprint
        )
        return PlannedVideo(decoded.stream, plan, decoded.frames, identity, overrides)

    def plan(self, stream: VideoStream, overrides: VideoOverrides = NO_OVERRIDES) -> VideoPlan:
        """The family's plan of a decoded ``stream`` under ``overrides`` of its video processor
        settings; InvalidArgument with the family's reason if it cannot take it."""
        clip = VideoClip(stream.num_frames, stream.fps, stream.width, stream.height)
        try:
            if self.processor is None:
                raise self.family.refuse_video()
            processor = with_settings(self.processor, overrides.settings)
            return self.family.plan_video(clip, self.config, processor)
        except VideoRefused as e:
            raise InvalidArgument(str(e), reason=e.reason) from e

    def check(self, overrides: VideoOverrides) -> None:
        """ValueError when the model's video processor cannot take ``overrides`` (a server's
        flags, checked at startup)."""
        if self.processor is not None:
            try:
                with_settings(self.processor, overrides.settings)
            except VideoRefused as e:
                raise ValueError(str(e)) from e

    def processor_keys(self) -> tuple[frozenset[str], frozenset[str]]:
        """The keyword arguments the model's video and image processors take together, and its
        image processor's (``video_overrides.resolve``)."""
        from transformers import AutoImageProcessor

        image = _valid_kwargs(AutoImageProcessor.from_pretrained(self.model_dir))
        return image | _valid_kwargs(self.processor), image

    def chunks(self, video: PlannedVideo, patches_per_chunk: int) -> list[VideoChunk]:
        """``video``'s chunks of ``patches_per_chunk`` temporal patches with their hashes."""
        return chunk_hashes(
            video.frames,
            video.plan,
            patches_per_chunk,
            model_id=self.model_id,
            fingerprint=self.fingerprint,
        )

    def pixel_inputs(
        self, frames: np.ndarray, plan: VideoPlan, device: str | None = None
    ) -> tuple[Any, Any]:
        """The tower's pixel values and grid of ``frames`` (all of ``plan``'s kept frames, or a
        chunk's), resized as ``plan`` says."""
        return self.family.video_pixel_inputs(
            self.processor, frames, plan.resized, device, self.config
        )


def check_resized(plan: VideoPlan, policy: MediaPolicy) -> VideoPlan:
    """``plan`` if its frames, resized, are within the policy's frame size (a request's pixel
    budget cannot lift it); else InvalidArgument VIDEO_FRAME_TOO_LARGE."""
    height, width = plan.resized
    if height * width > policy.max_video_frame_pixels:
        raise InvalidArgument(
            f"the video's frames would be resized to {width}x{height} pixels, over the limit of "
            f"{policy.max_video_frame_pixels} (--media-max-video-frame-pixels)",
            reason="VIDEO_FRAME_TOO_LARGE",
        )
    return plan


def _valid_kwargs(processor: Any) -> frozenset[str]:
    valid = getattr(processor, "valid_kwargs", None)
    return frozenset(getattr(valid, "__annotations__", {}))


def video_processor(model_dir: str | Path) -> Any:
    """The checkpoint's video processor, None where transformers has none for it (the family
    takes no video)."""
    from transformers import AutoVideoProcessor

    try:
        return AutoVideoProcessor.from_pretrained(model_dir)
    except (OSError, ValueError):
        return None
