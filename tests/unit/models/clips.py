"""Small video clips made in memory with PyAV, for the video tests."""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np


def clip_frames(num_frames: int, width: int, height: int) -> np.ndarray:
    """Distinct RGB frames: a colour ramp over time and a bar that moves."""
    frames = np.zeros((num_frames, height, width, 3), np.uint8)
    for index in range(num_frames):
        frames[index, ..., 0] = index * 37 % 256
        frames[index, :, : (index * 7) % width + 1, 1] = 200
        frames[index, : (index * 5) % height + 1, :, 2] = 120
    return frames


def make_clip(
    container: str = "mp4",
    codec: str = "libx264",
    *,
    num_frames: int = 20,
    width: int = 64,
    height: int = 48,
    fps: int = 10,
    frames: np.ndarray | None = None,
) -> bytes:
    """An encoded clip of ``frames`` (``clip_frames`` by default) at ``fps``."""
    frames = clip_frames(num_frames, width, height) if frames is None else frames
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container) as output:
        stream = output.add_stream(codec, rate=Fraction(fps))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                output.mux(packet)
        for packet in stream.encode():
            output.mux(packet)
    return buffer.getvalue()


def remux(data: bytes, container: str) -> bytes:
    """``data``'s video packets, unchanged, in a ``container`` of another kind: the same
    pictures under other timestamps (encoding twice may not give the same pictures: libx264
    in PyAV 18 sometimes encodes the same frames to other bytes)."""
    buffer = io.BytesIO()
    with av.open(io.BytesIO(data)) as source, av.open(buffer, "w", format=container) as output:
        video = source.streams.video[0]
        stream = output.add_stream_from_template(video)
        for packet in source.demux(video):
            if packet.dts is not None:
                packet.stream = stream
                output.mux(packet)
    return buffer.getvalue()


def pyav_frames(data: bytes) -> np.ndarray:
    """Every frame of ``data`` as PyAV decodes it (RGB), for comparison."""
    with av.open(io.BytesIO(data)) as container:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])
