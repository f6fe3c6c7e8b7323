"""Open untrusted video bytes with one FFmpeg demuxer, chosen by their signature, or refuse.

FFmpeg left to probe would try every demuxer it has on the bytes (playlists and concat lists
among them, which open further files); here the container is told by its first bytes, refused
unless the policy accepts it, and opened by its own demuxer alone, with every nested open
refused. The video stream's declared codec, frame size and frame count are then checked before
any frame is decoded (the video equivalent of a decompression bomb), and the decoder itself is
told the frame size limit, so a stream that grows its frames mid-way fails in FFmpeg before it
allocates them.
"""

from __future__ import annotations

import io
from typing import Any

from epd.common.errors import InvalidArgument
from epd.server.media.policy import MediaPolicy

#: FFmpeg's demuxer for each container of ``policy.VIDEO_CONTAINERS``
DEMUXERS = {"mp4": "mov", "mov": "mov", "webm": "matroska", "matroska": "matroska"}
ISO_BOXES = frozenset({b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide", b"pnot"})
EBML_MAGIC = b"\x1a\x45\xdf\xa3"
#: signatures of containers never accepted, named in refusals
OTHER_SIGNATURES = ((b"RIFF", "avi"), (b"FLV", "flv"), (b"GIF8", "gif"), (b"OggS", "ogg"))


def detect_container(data: bytes) -> str | None:
    """The container ``data`` starts like (``mp4``, ``mov``, ``webm``, ``matroska``, or a
    refused one such as ``avi``), None if none."""
    if data[4:8] in ISO_BOXES:
        return "mov" if data[4:8] != b"ftyp" or data[8:12] == b"qt  " else "mp4"
    if data.startswith(EBML_MAGIC):
        return "webm" if b"webm" in data[:64] else "matroska"
    return next((name for magic, name in OTHER_SIGNATURES if data.startswith(magic)), None)


def open_video(data: bytes, policy: MediaPolicy) -> Any:
    """``data`` opened by its container's demuxer (an ``av`` input container, to close), its
    video stream checked against ``policy`` (``checked_stream``)."""
    import av

    container_name = _accepted_container(data, policy)
    try:
        container = av.open(io.BytesIO(data), format=DEMUXERS[container_name], io_open=_refuse_open)
    except Exception as e:
        raise InvalidArgument(
            f"the {container_name} data is truncated or corrupt", reason="BAD_VIDEO"
        ) from e
    try:
        checked_stream(container, policy)
    except BaseException:
        container.close()
        raise
    return container


def checked_stream(container: Any, policy: MediaPolicy) -> Any:
    """The first video stream of ``container``, refused unless its declared codec, frame size
    and frame count are within ``policy``; its decoder is told the frame size limit."""
    if not container.streams.video:
        raise InvalidArgument("the file holds no video stream", reason="VIDEO_HAS_NO_FRAMES")
    stream = container.streams.video[0]
    if stream.codec_context is None:
        raise InvalidArgument(
            "the video stream's codec is not one FFmpeg decodes", reason="UNSUPPORTED_VIDEO_CODEC"
        )
    codec = stream.codec_context.codec.canonical_name
    if codec not in policy.video_codecs:
        raise InvalidArgument(
            f"{codec} video is not accepted (accepted: {', '.join(policy.video_codecs)})",
            reason="UNSUPPORTED_VIDEO_CODEC",
        )
    check_frame_size(stream.codec_context.width, stream.codec_context.height, policy)
    if stream.frames > policy.max_video_frames:
        raise InvalidArgument(
            f"the video declares {stream.frames} frames, the limit is {policy.max_video_frames}",
            reason="TOO_MANY_VIDEO_FRAMES",
        )
    stream.codec_context.options = {"max_pixels": str(policy.max_video_frame_pixels)}
    return stream


def check_frame_size(width: int, height: int, policy: MediaPolicy) -> None:
    """Refuse frames of over ``policy.max_video_frame_pixels``."""
    if width * height > policy.max_video_frame_pixels:
        raise InvalidArgument(
            f"video frames are {width}x{height} pixels, the limit is "
            f"{policy.max_video_frame_pixels} pixels",
            reason="VIDEO_FRAME_TOO_LARGE",
        )


def _accepted_container(data: bytes, policy: MediaPolicy) -> str:
    accepted = ", ".join(policy.video_containers)
    detected = detect_container(data)
    if detected is None:
        raise InvalidArgument(
            f"the video data is not in a supported container (supported: {accepted})",
            reason="BAD_VIDEO",
        )
    if detected not in policy.video_containers:
        raise InvalidArgument(
            f"{detected} videos are not accepted (accepted: {accepted})",
            reason="UNSUPPORTED_VIDEO_FORMAT",
        )
    return detected


def _refuse_open(url: str, flags: int, options: dict[str, str]) -> Any:
    raise PermissionError(f"a video may not open other files ({url})")
