"""An image's pixel budget: vLLM 0.32's image ``mm_processor_kwargs``, per request and per
server (``--mm-processor-kwargs``).

vLLM hands the image keys of ``mm_processor_kwargs`` (flat, or under ``images_kwargs``; the
server's merged under the request's) to the model's image processor, where Qwen's resize the
image within ``min_pixels`` / ``max_pixels`` (aliases of its ``size`` edges ``shortest_edge`` /
``longest_edge``: ``Qwen2VLProcessingInfo._get_vision_size``). epd honours that budget: the route
computes the image's grid under it, the item carries it (``MediaItem.image_settings``: the
``ImageSettings.key``) to the encoder or encode_prefill worker, which resizes alike, and the
image's mm_hash covers it (``hashing.under_settings``), so the same picture under two budgets
is two items, as vLLM hashes ``hf_processor_mm_kwargs`` with each item.

Which keys are refused, ignored or bad is ``video_overrides``' (one resolution of a request's
kwargs); nothing here lifts the media policy's pixel limit: a floor over it is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from epd.common.errors import InvalidArgument
from epd.server.media.video_overrides import (
    IMAGE_PIXEL_KEYS,
    MediaKwargs,
    checked_pixels,
    merged_processor_kwargs,
    scoped,
)

#: the keys of a budget as ``ImageSettings`` holds it
BUDGET_KEYS = ("min_pixels", "max_pixels")


@dataclass(frozen=True, slots=True)
class ImageSettings:
    """An image processor's pixel budget changed from the checkpoint's (None: the
    checkpoint's). ``settings`` and ``key`` are derived from the two once, when it is made."""

    min_pixels: int | None = None
    max_pixels: int | None = None
    #: the settings changed, by name
    settings: dict[str, int] = field(init=False, repr=False, compare=False)
    #: canonical text of ``settings`` ("" for none): ``MediaItem.image_settings`` and part of
    #: the image's mm_hash
    key: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        pairs = zip(BUDGET_KEYS, (self.min_pixels, self.max_pixels), strict=True)
        settings = {name: value for name, value in pairs if value is not None}
        object.__setattr__(self, "settings", settings)
        object.__setattr__(self, "key", json.dumps(settings, sort_keys=True) if settings else "")


NO_IMAGE_SETTINGS = ImageSettings()


def image_settings_of(key: str, max_pixels: int | None = None) -> ImageSettings:
    """The settings whose ``ImageSettings.key`` is ``key`` ("": none), as the route sent them,
    within the media policy's ``max_pixels`` where it is given (``check_floor``: a worker holds
    another hop's budget to its own limit); InvalidArgument: BAD_MEDIA_ITEM when
    ``key`` is not such a key, BAD_MEDIA_KWARGS for a floor over ``max_pixels``."""
    if not key:
        return NO_IMAGE_SETTINGS
    try:
        settings = ImageSettings(**json.loads(key))
    except (ValueError, TypeError) as e:
        raise _bad_key(key) from e
    values = settings.settings.values()
    if settings.key != key or not all(type(v) is int and v > 0 for v in values):
        raise _bad_key(key)
    if max_pixels is not None:
        check_floor(settings, max_pixels)
    return settings


def resolve_image(
    server: MediaKwargs, request: MediaKwargs, *, image_keys: frozenset[str], max_pixels: int
) -> ImageSettings:
    """The pixel budget ``request``'s ``mm_processor_kwargs`` merged over the ``server``'s give
    an image (``image_keys``: the keys the model's image processor takes; pixel keys it does
    not take are ignored, as it ignores them), within the media policy's ``max_pixels``
    (``check_floor``). InvalidArgument naming the key."""
    if not server.mm_processor_kwargs and not request.mm_processor_kwargs:
        return NO_IMAGE_SETTINGS
    image = scoped(merged_processor_kwargs(server, request), "images_kwargs")
    pixels = {key: image[key] for key in IMAGE_PIXEL_KEYS if key in image and key in image_keys}
    budget = ImageSettings(**checked_pixels(pixels))
    check_floor(budget, max_pixels)
    return budget


def check_floor(budget: ImageSettings, max_pixels: int) -> None:
    """BAD_MEDIA_KWARGS if ``budget``'s floor is over the media policy's ``max_pixels`` (it would
    resize every image over the limit)."""
    if budget.min_pixels is not None and budget.min_pixels > max_pixels:
        raise InvalidArgument(
            f"min_pixels ({budget.min_pixels}) is over the media pixel limit of {max_pixels} "
            "(--media-max-pixels)",
            reason="BAD_MEDIA_KWARGS",
            metadata={"param": "mm_processor_kwargs.min_pixels"},
        )


def _bad_key(key: str) -> InvalidArgument:
    return InvalidArgument(
        f"image settings {key[:200]!r} are not canonical image settings (a JSON object of "
        "positive min_pixels and max_pixels)",
        reason="BAD_MEDIA_ITEM",
    )
