"""Synthetic video clips for the benchmarks (``bench_e2e.py --video``): made in memory with PyAV
(H.264 in MP4), each seed a different clip, and the frames epd's route keeps of one, for a
system that takes decoded frames (monolithic vLLM)."""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image


@dataclass(frozen=True, slots=True)
class ClipShape:
    """A clip's frame size, length and frame rate."""

    width: int
    height: int
    seconds: float
    fps: int

    @classmethod
    def parse(cls, size: str, seconds: float, fps: int) -> ClipShape:
        """``"320x240"`` at ``seconds`` and ``fps``; ValueError names what is wrong."""
        width, _, height = size.partition("x")
        try:
            return cls(int(width), int(height), seconds, fps)
        except ValueError:
            raise ValueError(f"clip size {size!r}: expected WIDTHxHEIGHT, e.g. 320x240") from None

    @property
    def name(self) -> str:
        return f"{self.width}x{self.height}"

    @property
    def num_frames(self) -> int:
        return round(self.seconds * self.fps)


def clip_frames(seed: int, shape: ClipShape) -> np.ndarray:
    """RGB frames: a diagonal gradient sliding sideways, a bright square crossing the picture
    and coarse noise, all placed by ``seed`` (uint8 [frames, height, width, 3])."""
    rng = np.random.default_rng(seed & 0xFFFFFFFF)
    height, width = shape.height, shape.width
    rows, columns = np.mgrid[0:height, 0:width]
    ramp = ((rows + columns) % 256).astype(np.uint8)[..., None]
    phase, colour = rng.integers(0, 256, 3), rng.integers(64, 256, 3)
    noise = rng.integers(0, 48, (shape.num_frames, height // 8 + 1, width // 8 + 1, 3), np.uint8)
    frames = np.empty((shape.num_frames, height, width, 3), np.uint8)
    side = max(8, min(height, width) // 4)
    for index in range(shape.num_frames):
        # NOTE: uint8 sums wrap around, which keeps the gradient sliding
        shift = ((4 * index + phase) % 256).astype(np.uint8)
        frames[index] = ramp + shift + noise[index].repeat(8, 0).repeat(8, 1)[:height, :width]
        left = (index * 7 + int(phase[0])) % max(1, width - side)
        top = (index * 3 + int(phase[1])) % max(1, height - side)
        frames[index, top : top + side, left : left + side] = colour
    return frames


def encode_mp4(frames: np.ndarray, fps: int) -> bytes:
    """``frames`` as H.264 (yuv420p) in MP4 at ``fps``."""
    import av

    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as output:
        stream = output.add_stream("libx264", rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        stream.options = {"preset": "ultrafast"}
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                output.mux(packet)
        for packet in stream.encode():
            output.mux(packet)
    return buffer.getvalue()


def png_base64(frame: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(frame).save(buffer, format="PNG", compress_level=1)
    return base64.b64encode(buffer.getvalue()).decode()


@dataclass
class Clip:
    """One encoded clip; ``planner`` gives the frames epd keeps of it."""

    data: bytes
    planner: Any = field(repr=False)

    def part(self) -> dict[str, Any]:
        """The clip as an OpenAI ``video_url`` part (an MP4 data URL), as epd takes it."""
        url = "data:video/mp4;base64," + base64.b64encode(self.data).decode()
        return {"type": "video_url", "video_url": {"url": url}}

    @cached_property
    def kept_frames(self) -> np.ndarray:
        """The frames epd's route decodes and keeps (the model's sampling), at decoded size."""
        from epd.server.media.policy import MediaPolicy

        return np.asarray(self.planner.load(self.data, MediaPolicy()).frames)

    def vllm_part(self) -> dict[str, Any]:
        """The kept frames as vLLM's frame-list video (``data:video/jpeg;base64,F1,F2,...``): PNG
        frames, which Pillow decodes losslessly whatever the media type says."""
        frames = ",".join(png_base64(frame) for frame in self.kept_frames)
        return {"type": "video_url", "video_url": {"url": "data:video/jpeg;base64," + frames}}


class VideoClips:
    """Clips by (seed, shape), made once each, and the model's plan of them."""

    def __init__(self, model_dir: Path) -> None:
        from epd.server.media.video_planner import VideoPlanner

        self.model_dir = model_dir
        self.planner = VideoPlanner(model_dir, "tiny")
        self.shapes: list[ClipShape] = []
        self._clips: dict[tuple[int, ClipShape], Clip] = {}

    def clip(self, seed: int, shape: ClipShape) -> Clip:
        """The clip of ``seed`` in ``shape`` (the same object every time)."""
        key = (seed, shape)
        if key not in self._clips:
            frames = clip_frames(seed, shape)
            self._clips[key] = Clip(encode_mp4(frames, shape.fps), self.planner)
        return self._clips[key]

    def temporal_patches(self, shape: ClipShape) -> int:
        """Temporal patches the model makes of a clip of ``shape`` (remembers the shape)."""
        if shape not in self.shapes:
            self.shapes.append(shape)
        from epd.server.media.policy import MediaPolicy

        planned = self.planner.load(self.clip(0, shape).data, MediaPolicy())
        return int(planned.plan.num_temporal_patches)
