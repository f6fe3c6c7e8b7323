"""Decode untrusted image bytes into a correct RGB picture, or refuse with a clear reason.

Only the policy's formats are opened (Pillow's ``formats=``), so no other plugin parses the
bytes. Declared dimensions, and for JPEG the number of scans, are checked before any pixel is
decoded; the image is then decoded fully (not just opened) so truncated or corrupt data fails
here, not later; every decoder exception is bad input, reported by what is wrong with the input,
never by the decoder's own text. No global Pillow flag is changed. EXIF orientation is applied;
16-bit, 32-bit integer and float images are scaled to 8 bits; palette and alpha images are
composited on white; animated images give their first frame.

NOTE: a progressive JPEG costs a pass over the whole image per scan, so a small file with
thousands of scans takes seconds to minutes to decode. Counting scans in the bytes bounds that
work per pixel before decoding starts; a decode cannot be stopped midway (it runs in a thread),
so the bound is what keeps the worst case within a few times that of an honest image.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from epd.common.errors import InvalidArgument
from epd.server.media.policy import MediaPolicy

JPEG_START_OF_SCAN = b"\xff\xda"


def _refuse(message: str, reason: str) -> InvalidArgument:
    return InvalidArgument(message, reason=reason)


def decode_image(
    data: bytes, policy: MediaPolicy, opened: Image.Image | None = None
) -> Image.Image:
    """Decode ``data`` under ``policy``'s limits; returns an RGB image. ``opened``: ``data`` as
    ``open_image`` opened it already (None: opened here)."""
    image = open_image(data, policy) if opened is None else opened
    _check_scans(image, data, policy)
    try:
        image.seek(0)
        image.load()
        return to_rgb(ImageOps.exif_transpose(image) or image)
    except Exception as e:
        raise _refuse(f"the {image.format} data is truncated or corrupt", "BAD_IMAGE") from e


def open_image(data: bytes, policy: MediaPolicy) -> Image.Image:
    """``data`` opened (header read, no pixel decoded) if it is within the policy's byte limit,
    in one of its formats and its declared size within its pixel limit."""
    if not data:
        raise _refuse("image is empty", "EMPTY_IMAGE")
    if len(data) > policy.max_bytes:
        raise _refuse(
            f"image is {len(data)} bytes, the limit is {policy.max_bytes}", "IMAGE_TOO_LARGE"
        )
    try:
        # NOTE: no warnings.catch_warnings here: it swaps process-wide state and decoding runs in
        # threads. Pillow's own bomb check (warning, then error at 2x) fires in open(); ours
        # below is tighter and runs before any pixel is decoded.
        image = Image.open(io.BytesIO(data), formats=policy.image_formats)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise _refuse(
            f"image has more pixels than the limit of {policy.max_pixels}", "TOO_MANY_PIXELS"
        ) from e
    except Exception as e:
        raise _unreadable(data, policy) from e
    width, height = image.size
    if width * height > policy.max_pixels:
        raise _refuse(
            f"image is {width}x{height} pixels, the limit is {policy.max_pixels} pixels",
            "TOO_MANY_PIXELS",
        )
    return image


def _check_scans(image: Image.Image, data: bytes, policy: MediaPolicy) -> None:
    # NOTE: every start-of-scan marker libjpeg acts on is these two bytes (entropy-coded data
    # stuffs a zero after each 0xFF), so counting them never undercounts; the few found in
    # metadata (an EXIF thumbnail's own scans) overcount harmlessly. JPEG inside TIFF is bounded
    # by libtiff itself (100 scans per strip or tile).
    if image.format not in ("JPEG", "MPO"):
        return
    num_scans = data.count(JPEG_START_OF_SCAN)
    if num_scans > policy.max_jpeg_scans:
        raise _refuse(
            f"the JPEG data has {num_scans} scans, the limit is {policy.max_jpeg_scans} (a "
            "progressive JPEG has about 10): re-encode the image",
            "IMAGE_TOO_COMPLEX",
        )


def _unreadable(data: bytes, policy: MediaPolicy) -> InvalidArgument:
    """The refusal of bytes no allowed format could open, named by what they look like."""
    supported = ", ".join(policy.image_formats)
    detected = detect_format(data)
    if detected is None:
        return _refuse(
            f"the image data is not in a supported format (supported: {supported})", "BAD_IMAGE"
        )
    if detected not in policy.image_formats:
        return _refuse(
            f"{detected} images are not accepted (supported: {supported})",
            "UNSUPPORTED_IMAGE_FORMAT",
        )
    return _refuse(f"the {detected} data is truncated or corrupt", "BAD_IMAGE")


def detect_format(data: bytes) -> str | None:
    """The Pillow format whose signature starts ``data``, without running any plugin."""
    Image.init()
    prefix = data[:16]
    for name in Image.ID:
        accept = Image.OPEN[name][1]
        if accept is not None and _accepts(accept, prefix):
            return name
    return None


def _accepts(accept: Any, prefix: bytes) -> bool:
    # NOTE: some plugins' signature checks index past the end of a prefix shorter than theirs.
    try:
        return bool(accept(prefix))
    except Exception:
        return False


def to_rgb(image: Image.Image) -> Image.Image:
    """``image`` as 8-bit RGB (see the module docstring for each mode)."""
    if image.mode == "RGB":
        return image
    if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        return Image.fromarray(_to_uint8(np.asarray(image)), mode="L").convert("RGB")
    if (image.mode == "P" and "transparency" in image.info) or image.mode in ("LA", "PA"):
        image = image.convert("RGBA")
    if image.mode == "RGBA":
        background = Image.new("RGB", image.size, (255, 255, 255))
        background.paste(image, mask=image.getchannel("A"))
        return background
    return image.convert("RGB")


def _to_uint8(pixels: np.ndarray) -> np.ndarray:
    if pixels.dtype.kind == "f":
        values = np.nan_to_num(pixels.astype(np.float64))
        scale = 255.0 if values.max(initial=0.0) <= 1.0 else 1.0
        return np.clip(values * scale, 0, 255).astype(np.uint8)
    maximum = 65535 if pixels.dtype.itemsize >= 2 else 255
    return (np.clip(pixels.astype(np.int64), 0, maximum) * 255 // maximum).astype(np.uint8)
