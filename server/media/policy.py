"""The rules every image must pass, shared by the encode service and the route."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from epd.common.flags import flag

MiB = 1 << 20

# NOTE: formats Pillow decodes itself with widely fuzzed libraries. Never EPS (Pillow runs
# Ghostscript on it) nor the long tail of rarely used plugins.
DEFAULT_IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")
EXTERNAL_PROGRAM_FORMATS = frozenset({"EPS"})
# NOTE: containers whose signature ``video_container`` recognises and whose FFmpeg demuxer it
# runs alone; codecs by FFmpeg's canonical name, each decoded by a widely fuzzed decoder.
VIDEO_CONTAINERS = ("mp4", "mov", "webm", "matroska")
DEFAULT_VIDEO_CODECS = ("h264", "hevc", "vp8", "vp9", "av1")

# Videos one prompt may hold by default (engines take as many: ``vllm_args``).
DEFAULT_MAX_VIDEOS = 4
# Video tokens (embedding rows) one prompt may hold by default: about two minutes of Qwen2.5-VL
# video sampled at 2 frames a second at 448 x 448 (256 tokens a temporal patch of 2 frames).
DEFAULT_MAX_VIDEO_TOKENS = 32768


def json_object(text: str) -> dict[str, Any]:
    """A JSON object from its text (vLLM's ``--mm-processor-kwargs '{"fps": 1}'``)."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"{text!r} is not a JSON object")
    return value


def format_list(text: str) -> tuple[str, ...]:
    """Pillow format names from a comma-separated list, upper-cased."""
    return tuple(name.strip().upper() for name in text.split(",") if name.strip())


def name_list(text: str) -> tuple[str, ...]:
    """Container or codec names from a comma-separated list, lower-cased."""
    return tuple(name.strip().lower() for name in text.split(",") if name.strip())


@dataclass(frozen=True, slots=True)
class MediaPolicy:
    """Limits and permissions for loading images.

    ``max_url_chars`` bounds http(s) and file: URLs and the header of a data: URL, whose payload
    is bounded by ``max_bytes`` instead (base64: about 4/3 of it). ``image_formats`` are the
    Pillow format names accepted (an MPO file from a camera is read as JPEG). ``max_jpeg_scans``
    bounds the scans of a JPEG: decoding costs a pass over the image per scan, so it bounds the
    decoding work per pixel (real progressive JPEGs have about 10).

    The ``*video*`` fields bound videos (``video.decode_video``): their own byte limit, what
    decodes (frames, seconds measured from the frames' timestamps, pixels per frame, frame rate,
    time spent), the containers and codecs accepted, and the videos one prompt may hold and their
    tokens together.

    ``mm_processor_kwargs`` and ``media_io_kwargs`` are vLLM's flags of the same names: the
    server's overrides of the model's video sampling and pixel budget, under which a request's
    own are merged where ``trust_request_mm_kwargs`` lets it send them
    (``video_overrides``); the limits above bound either.
    """

    max_bytes: int = field(
        default=20 * MiB,
        metadata=flag(
            "largest encoded image accepted, in MiB",
            env="EPD_MEDIA_MAX_MB",
            name="media-max-mb",
            unit=MiB,
        ),
    )
    max_pixels: int = field(
        default=32_000_000,
        metadata=flag(
            "largest decoded image, width x height; larger ones are refused before decoding",
            env="EPD_MEDIA_MAX_PIXELS",
            name="media-max-pixels",
        ),
    )
    fetch_timeout_s: float = field(
        default=10.0,
        metadata=flag(
            "time limit for fetching one URL, redirects included",
            env="EPD_MEDIA_FETCH_TIMEOUT_S",
            name="media-fetch-timeout-s",
        ),
    )
    max_redirects: int = 5
    allow_local_files: bool = field(
        default=False, metadata=flag("accept file: URLs", env="EPD_ALLOW_LOCAL_FILES")
    )
    allow_private_networks: bool = field(
        default=False,
        metadata=flag(
            "allow fetching from loopback, private and link-local addresses",
            env="EPD_ALLOW_PRIVATE_NETWORKS",
            default_help="default off: SSRF guard",
        ),
    )
    max_url_chars: int = field(
        default=8 << 10,
        metadata=flag(
            "longest http(s) or file: URL, and longest data: URL header; a data: URL's payload "
            "is bounded by --media-max-mb instead",
            env="EPD_MEDIA_MAX_URL_CHARS",
            name="media-max-url-chars",
        ),
    )
    image_formats: tuple[str, ...] = field(
        default=DEFAULT_IMAGE_FORMATS,
        metadata=flag(
            "comma-separated Pillow formats accepted; others are refused before decoding",
            env="EPD_MEDIA_IMAGE_FORMATS",
            name="media-image-formats",
            type=format_list,
        ),
    )
    max_jpeg_scans: int = field(
        default=100,
        metadata=flag(
            "most scans a JPEG may have; each costs a pass over the image, so this bounds the "
            "decoding work per pixel",
            env="EPD_MEDIA_MAX_JPEG_SCANS",
            name="media-max-jpeg-scans",
        ),
    )

    max_video_bytes: int = field(
        default=256 * MiB,
        metadata=flag(
            "largest encoded video accepted, in MiB (images have --media-max-mb)",
            env="EPD_MEDIA_MAX_VIDEO_MB",
            name="media-max-video-mb",
            unit=MiB,
        ),
    )
    max_video_seconds: float = field(
        default=300.0,
        metadata=flag(
            "longest video, in seconds as its frames' timestamps measure it (never as the "
            "container declares)",
            env="EPD_MEDIA_MAX_VIDEO_SECONDS",
            name="media-max-video-seconds",
        ),
    )
    max_video_frames: int = field(
        default=18_000,
        metadata=flag(
            "most frames decoded from one video; a container declaring more is refused before "
            "decoding",
            env="EPD_MEDIA_MAX_VIDEO_FRAMES",
            name="media-max-video-frames",
        ),
    )
    max_video_frame_pixels: int = field(
        default=3840 * 2160,
        metadata=flag(
            "largest video frame, width x height; larger declared frames are refused before "
            "decoding",
            env="EPD_MEDIA_MAX_VIDEO_FRAME_PIXELS",
            name="media-max-video-frame-pixels",
        ),
    )
    max_video_fps: float = field(
        default=240.0,
        metadata=flag(
            "highest frame rate, as the frames' timestamps measure it",
            env="EPD_MEDIA_MAX_VIDEO_FPS",
            name="media-max-video-fps",
        ),
    )
    video_decode_timeout_s: float = field(
        default=60.0,
        metadata=flag(
            "time limit for decoding one video, all its passes included",
            env="EPD_MEDIA_VIDEO_DECODE_TIMEOUT_S",
            name="media-video-decode-timeout-s",
        ),
    )
    video_containers: tuple[str, ...] = field(
        default=VIDEO_CONTAINERS,
        metadata=flag(
            f"comma-separated video containers accepted, of {', '.join(VIDEO_CONTAINERS)}; "
            "others are refused before decoding",
            env="EPD_MEDIA_VIDEO_CONTAINERS",
            name="media-video-containers",
            type=name_list,
        ),
    )
    video_codecs: tuple[str, ...] = field(
        default=DEFAULT_VIDEO_CODECS,
        metadata=flag(
            "comma-separated video codecs accepted (FFmpeg's names); others are refused before "
            "decoding",
            env="EPD_MEDIA_VIDEO_CODECS",
            name="media-video-codecs",
            type=name_list,
        ),
    )
    max_videos: int = field(
        default=DEFAULT_MAX_VIDEOS,
        metadata=flag(
            "videos one prompt may hold",
            env="EPD_MEDIA_MAX_VIDEOS",
            name="media-max-videos",
        ),
    )
    max_video_tokens: int = field(
        default=DEFAULT_MAX_VIDEO_TOKENS,
        metadata=flag(
            "video tokens (embedding rows, as the model's video processor plans them) all the "
            "videos of one prompt may hold together; checked before any encoder runs",
            env="EPD_MEDIA_MAX_VIDEO_TOKENS",
            name="media-max-video-tokens",
        ),
    )
    mm_processor_kwargs: dict[str, Any] | None = field(
        default=None,
        metadata=flag(
            "the model's processor settings changed for every request, as vllm serve's flag: a "
            'JSON object, e.g. \'{"fps": 1, "videos_kwargs": {"max_pixels": 200704}}\'; epd '
            "honours the video sampling (fps, num_frames, min_frames, max_frames) and the pixel "
            "budget (min_pixels, max_pixels, size: flat for images and videos, or in "
            "images_kwargs or videos_kwargs) and refuses the rest by name (docs/video.md)",
            env="EPD_MM_PROCESSOR_KWARGS",
            type=json_object,
            default_help="default: the checkpoint's",
        ),
    )
    media_io_kwargs: dict[str, Any] | None = field(
        default=None,
        metadata=flag(
            "media loading options by modality for every request, as vllm serve's flag: a JSON "
            'object, e.g. \'{"video": {"num_frames": 16}}\'; epd honours video fps, num_frames, '
            "min_frames and max_frames",
            env="EPD_MEDIA_IO_KWARGS",
            type=json_object,
            default_help="default: none",
        ),
    )
    trust_request_mm_kwargs: bool = field(
        default=False,
        metadata=flag(
            "accept a request's own mm_processor_kwargs and media_io_kwargs (vllm serve's flag); "
            "without it they are refused as vLLM refuses them, since they change the work a "
            "request costs",
            env="EPD_TRUST_REQUEST_MM_KWARGS",
        ),
    )

    def __post_init__(self) -> None:
        limits = (
            self.max_bytes,
            self.max_pixels,
            self.fetch_timeout_s,
            self.max_url_chars,
            self.max_jpeg_scans,
            self.max_video_bytes,
            self.max_video_seconds,
            self.max_video_frames,
            self.max_video_frame_pixels,
            self.max_video_fps,
            self.video_decode_timeout_s,
            self.max_videos,
            self.max_video_tokens,
        )
        if min(limits) <= 0:
            raise ValueError("media limits must be positive")
        unknown_containers = set(self.video_containers) - set(VIDEO_CONTAINERS)
        if unknown_containers or not self.video_containers:
            raise ValueError(
                f"video containers {sorted(unknown_containers)} are not among "
                f"{', '.join(VIDEO_CONTAINERS)}"
            )
        _check_video_codecs(self.video_codecs)
        Image.init()
        unknown = [name for name in self.image_formats if name not in Image.OPEN]
        if unknown or not self.image_formats:
            raise ValueError(f"image formats {unknown} are not formats Pillow reads")
        if EXTERNAL_PROGRAM_FORMATS.intersection(self.image_formats):
            raise ValueError(
                f"{sorted(EXTERNAL_PROGRAM_FORMATS)} images are decoded by an "
                "external program and cannot be accepted"
            )


def _check_video_codecs(codecs: tuple[str, ...]) -> None:
    import av

    unknown = sorted(set(codecs) - set(av.codecs_available))
    if unknown or not codecs:
        raise ValueError(f"video codecs {unknown} are not codecs FFmpeg knows")
