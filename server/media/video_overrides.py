"""Overrides of a model's video sampling and pixel budget: vLLM 0.32's ``mm_processor_kwargs``
and ``media_io_kwargs``, per request and per server (``--mm-processor-kwargs``,
``--media-io-kwargs``).

vLLM hands ``mm_processor_kwargs`` to the model's Hugging Face processor (the server's merged
under the request's: ``vllm.config.multimodal._merge_mm_processor_kwargs``; flat keys reach every
modality that takes them, ``videos_kwargs``/``images_kwargs`` one) and ``media_io_kwargs`` by
modality to its media loaders (``VideoMediaIO.merge_kwargs``: a request's ``fps`` drops the
server's ``num_frames`` and the reverse). epd decodes and samples a video once, at the route, by
the model's video processor settings, so the keys that set those settings are honoured there:

- sampling (``fps``, ``num_frames``, ``min_frames``, ``max_frames``): the processor's
  ``sample_frames``; ``media_io_kwargs.video``'s give way to ``mm_processor_kwargs``' (epd has
  one sampling stage where vLLM has its loader's and its processor's);
- pixel budget (``min_pixels``, ``max_pixels``, Qwen's ``size`` of ``shortest_edge`` /
  ``longest_edge``, ``cap_pixels_per_frame``): the resize; the aliases resolve as vLLM's
  ``Qwen2VLProcessingInfo._get_vision_size`` (``size``, then the pixels). ``max_video_tokens``
  is refused: vLLM's Qwen3-VL does not apply it as transformers does.

Keys vLLM ignores or that change nothing epd computes are ignored as vLLM ignores them
(``do_normalize``/``do_rescale``: vLLM normalises on the device; ``device``, ``return_*``;
``media_io_kwargs.video``'s ``hw_decoders``, ``pool_size``, ``device``; keys no processor
takes). An image's pixel budget (the same pixel keys, flat or under ``images_kwargs``) is
``image_settings``'. Every other processor setting, every other loader option, and every other
image setting in a request with an image are refused by name (``MEDIA_KWARGS_NOT_SUPPORTED``):
encoders resize images within that budget and otherwise with the model's own settings, and
videos are decoded by epd's decoder. Bad values are ``BAD_MEDIA_KWARGS``. Nothing here lifts a
media limit: plans are checked against the policy.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from epd.common.errors import InvalidArgument

SAMPLING_KEYS = ("fps", "num_frames", "min_frames", "max_frames")
PIXEL_KEYS = ("min_pixels", "max_pixels", "size", "cap_pixels_per_frame")
#: the pixel budget of an image (``image_settings``)
IMAGE_PIXEL_KEYS = ("min_pixels", "max_pixels", "size")
#: processor keys vLLM does not apply (normalised on the device) or that set where, not what
IGNORED_PROCESSOR_KEYS = frozenset(
    {"do_normalize", "do_rescale", "device", "return_tensors", "return_metadata"}
)
#: loader keys vLLM drops from a request (``VideoMediaIO.merge_kwargs``); epd has no such pools
IGNORED_VIDEO_IO_KEYS = frozenset({"hw_decoders", "pool_size", "device"})
SCOPES = ("text_kwargs", "images_kwargs", "videos_kwargs", "audio_kwargs")
#: vLLM's refusals without ``--trust-request-mm-kwargs`` (``validate_request_mm_kwargs``)
UNTRUSTED = {
    "mm_processor_kwargs": (
        "Per-request mm_processor_kwargs are disabled by default because they can change "
        "multimodal preprocessing resource usage. Start the server with "
        "--trust-request-mm-kwargs only when clients are trusted."
    ),
    "media_io_kwargs": (
        "Per-request media_io_kwargs are disabled by default because they can change "
        "multimodal media loading resource usage. Start the server with "
        "--trust-request-mm-kwargs only when clients are trusted."
    ),
}


@dataclass(frozen=True, slots=True)
class VideoOverrides:
    """Video processor settings changed from the checkpoint's (None: the checkpoint's)."""

    fps: float | None = None
    num_frames: int | None = None
    min_frames: int | None = None
    max_frames: int | None = None
    min_pixels: int | None = None
    max_pixels: int | None = None
    cap_pixels_per_frame: bool | None = None

    @property
    def settings(self) -> dict[str, Any]:
        """The settings changed, by name."""
        return {name: value for name, value in asdict(self).items() if value is not None}

    @property
    def changes_pixels(self) -> bool:
        """Whether the pixel budget differs from the checkpoint's."""
        return any(
            v is not None for v in (self.min_pixels, self.max_pixels, self.cap_pixels_per_frame)
        )

    @property
    def key(self) -> str:
        """Canonical text of the settings changed ("" for none): part of a cache key."""
        settings = self.settings
        return json.dumps(settings, sort_keys=True) if settings else ""


NO_OVERRIDES = VideoOverrides()


def overrides_of(key: str) -> VideoOverrides:
    """The overrides whose ``VideoOverrides.key`` is ``key`` ("": none), as another hop sent
    them; InvalidArgument (BAD_VIDEO_SPAN) when it is not such a key."""
    if not key:
        return NO_OVERRIDES
    try:
        settings = json.loads(key)
        overrides = VideoOverrides(**settings)
    except (ValueError, TypeError) as e:
        raise InvalidArgument(
            f"video settings {key[:200]!r} are not a JSON object of video processor settings",
            reason="BAD_VIDEO_SPAN",
        ) from e
    if overrides.key != key or not all(
        isinstance(value, int | float) for value in overrides.settings.values()
    ):
        raise InvalidArgument(
            f"video settings {key[:200]!r} are not canonical video processor settings",
            reason="BAD_VIDEO_SPAN",
        )
    return overrides


@dataclass(frozen=True, slots=True)
class MediaKwargs:
    """A request's ``mm_processor_kwargs`` and ``media_io_kwargs`` as sent (None: not sent)."""

    mm_processor_kwargs: dict[str, Any] | None = None
    media_io_kwargs: dict[str, Any] | None = None

    def __bool__(self) -> bool:
        return bool(self.mm_processor_kwargs) or bool(self.media_io_kwargs)


NO_KWARGS = MediaKwargs()
#: the request fields a ``MediaKwargs`` holds
REQUEST_FIELDS = frozenset({"mm_processor_kwargs", "media_io_kwargs"})


def check_trusted(kwargs: MediaKwargs, trusted: bool) -> None:
    """Refuse ``kwargs`` as vLLM does unless the server trusts them (an empty dict passes)."""
    if trusted:
        return
    for param, given in (
        ("mm_processor_kwargs", kwargs.mm_processor_kwargs),
        ("media_io_kwargs", kwargs.media_io_kwargs),
    ):
        if given:
            raise _refused(UNTRUSTED[param], param, "BAD_REQUEST")


def resolve(
    server: MediaKwargs,
    request: MediaKwargs,
    *,
    processor_keys: frozenset[str],
    image_keys: frozenset[str],
    has_images: bool,
) -> VideoOverrides:
    """The video overrides of ``request``'s kwargs merged over the ``server``'s, as vLLM merges
    them. ``processor_keys``: the keys the model's video and image processors take (others are
    ignored, as the processor ignores them); ``image_keys``: those its image processor takes
    (refused when ``has_images``, but the ignored ones). InvalidArgument naming the key."""
    if not server and not request:
        return NO_OVERRIDES
    from vllm.multimodal.media.video import VideoMediaIO

    processor = merged_processor_kwargs(server, request)
    io = _io_video(server.media_io_kwargs, request.media_io_kwargs)
    video_io = VideoMediaIO.merge_kwargs(io[0], io[1])
    if has_images:
        _refuse_image_keys(processor, image_keys)
    video = scoped(processor, "videos_kwargs")
    _refuse_unhonoured(video, processor_keys)
    if "fps" in video and "num_frames" in video:
        raise _refused(
            "`num_frames` and `fps` are mutually exclusive arguments, please use only one!",
            "mm_processor_kwargs",
        )
    sampling = {key: video_io[key] for key in SAMPLING_KEYS if key in video_io}
    if {"fps", "num_frames"} & video.keys():
        sampling.pop("fps", None)
        sampling.pop("num_frames", None)
    sampling.update({key: video[key] for key in SAMPLING_KEYS if key in video})
    checked = _checked_sampling(sampling, "mm_processor_kwargs")
    return VideoOverrides(**checked, **checked_pixels(video))


def merged_processor_kwargs(server: MediaKwargs, request: MediaKwargs) -> dict[str, Any]:
    """``request``'s ``mm_processor_kwargs`` merged over the ``server``'s, as vLLM merges them;
    InvalidArgument when either is not an object."""
    from vllm.config.multimodal import _merge_mm_processor_kwargs

    merged = _merge_mm_processor_kwargs(
        _mapping(server.mm_processor_kwargs, "mm_processor_kwargs"),
        _mapping(request.mm_processor_kwargs, "mm_processor_kwargs"),
    )
    return dict(merged)


def _mapping(value: Any, param: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _refused(f"{param} must be an object", param)
    return dict(value)


def _io_video(server: Any, request: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The server's and the request's ``media_io_kwargs.video``, other modalities checked."""
    found = []
    for given in (server, request):
        modalities = _mapping(given, "media_io_kwargs")
        for modality, options in modalities.items():
            param = f"media_io_kwargs.{modality}"
            if modality == "image" and options:
                raise _refused(
                    f"{param} is not supported: epd decodes images with its own decoder",
                    param,
                    "MEDIA_KWARGS_NOT_SUPPORTED",
                )
            _mapping(options, param)
        video = _mapping(modalities.get("video"), "media_io_kwargs.video")
        for key in video.keys() - set(SAMPLING_KEYS) - IGNORED_VIDEO_IO_KEYS:
            raise _refused(
                f"media_io_kwargs.video.{key} is not supported: epd decodes every video with "
                "its own decoder (PyAV), at the route; it takes fps, num_frames, min_frames "
                "and max_frames",
                f"media_io_kwargs.video.{key}",
                "MEDIA_KWARGS_NOT_SUPPORTED",
            )
        kept = {k: v for k, v in video.items() if k not in IGNORED_VIDEO_IO_KEYS}
        found.append(_checked_sampling(kept, "media_io_kwargs.video"))
    return found[0], found[1]


def scoped(kwargs: Mapping[str, Any], scope: str) -> dict[str, Any]:
    """The keys one modality's processor gets: the flat ones, then its scope's over them (a
    key set to null is left at the processor's setting)."""
    flat = {key: value for key, value in kwargs.items() if key not in SCOPES}
    merged = {**flat, **_mapping(kwargs.get(scope), f"mm_processor_kwargs.{scope}")}
    return {key: value for key, value in merged.items() if value is not None}


def _refuse_image_keys(processor: Mapping[str, Any], image_keys: frozenset[str]) -> None:
    for key in scoped(processor, "images_kwargs"):
        if key in image_keys and key not in IGNORED_PROCESSOR_KEYS | set(IMAGE_PIXEL_KEYS):
            raise _refused(
                f"mm_processor_kwargs.{key} is not supported with an image in the request: "
                "epd's encoders resize images within a pixel budget (min_pixels, max_pixels, "
                "size) and otherwise with the model's own settings",
                f"mm_processor_kwargs.{key}",
                "MEDIA_KWARGS_NOT_SUPPORTED",
            )


def _refuse_unhonoured(video: Mapping[str, Any], processor_keys: frozenset[str]) -> None:
    honoured = set(SAMPLING_KEYS) | set(PIXEL_KEYS) | IGNORED_PROCESSOR_KEYS
    for key in video:
        if key in processor_keys and key not in honoured:
            raise _refused(
                f"mm_processor_kwargs.{key} is not supported: epd plans a video once, at the "
                "route, and its encoders process it with the model's own settings; it takes "
                f"{', '.join(SAMPLING_KEYS + PIXEL_KEYS)}",
                f"mm_processor_kwargs.{key}",
                "MEDIA_KWARGS_NOT_SUPPORTED",
            )


def _checked_sampling(sampling: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """``sampling``'s values checked (``prefix``: where they were given)."""
    checked: dict[str, Any] = {}
    for key, value in sampling.items():
        kind = float if key == "fps" else int
        checked[key] = kind(_positive(value, f"{prefix}.{key}", kind))
    if checked.get("min_frames", 1) > checked.get("max_frames", math.inf):
        raise _refused(
            f"min_frames ({checked['min_frames']}) is over max_frames ({checked['max_frames']})",
            f"{prefix}.min_frames",
        )
    return checked


def checked_pixels(video: Mapping[str, Any]) -> dict[str, Any]:
    """The pixel settings of ``video``'s keys (or an image's: ``image_settings``): ``size``'s
    edges, then ``min_pixels`` / ``max_pixels`` over them (vLLM's ``_get_vision_size``)."""
    size = _mapping(video.get("size"), "mm_processor_kwargs.size")
    for key in size.keys() - {"shortest_edge", "longest_edge"}:
        raise _refused(
            f"mm_processor_kwargs.size.{key} is not supported: size is a pixel budget, "
            "shortest_edge and longest_edge",
            f"mm_processor_kwargs.size.{key}",
            "MEDIA_KWARGS_NOT_SUPPORTED",
        )
    bounds = {"min_pixels": size.get("shortest_edge"), "max_pixels": size.get("longest_edge")}
    bounds.update({key: video[key] for key in bounds if video.get(key) is not None})
    checked: dict[str, Any] = {
        key: int(_positive(value, f"mm_processor_kwargs.{key}", int))
        for key, value in bounds.items()
        if value is not None
    }
    if checked.get("min_pixels", 1) > checked.get("max_pixels", math.inf):
        raise _refused(
            f"min_pixels ({checked['min_pixels']}) is over max_pixels ({checked['max_pixels']})",
            "mm_processor_kwargs.min_pixels",
        )
    if "cap_pixels_per_frame" in video:
        if not isinstance(video["cap_pixels_per_frame"], bool):
            raise _refused(
                "cap_pixels_per_frame must be true or false",
                "mm_processor_kwargs.cap_pixels_per_frame",
            )
        checked["cap_pixels_per_frame"] = video["cap_pixels_per_frame"]
    return checked


def _positive(value: Any, param: str, kind: type) -> float:
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not is_number or not 0 < value < math.inf or (kind is int and value != int(value)):
        noun = "a positive integer" if kind is int else "a positive number"
        raise _refused(f"{param} must be {noun}, not {value!r}", param)
    return float(value)


def _refused(message: str, param: str, reason: str = "BAD_MEDIA_KWARGS") -> InvalidArgument:
    return InvalidArgument(message, reason=reason, metadata={"param": param})
