"""Decode untrusted image bytes into a correct RGB picture, or refuse with a clear reason.

Declared dimensions are checked before any pixel is decoded; the image is then decoded fully
(not just opened) so truncated or corrupt data fails here, not later; every decoder exception is
bad input. No global Pillow flag is changed. EXIF orientation is applied; 16-bit, 32-bit integer
and float images are scaled to 8 bits; palette and alpha images are composited on white; animated
images give their first frame.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageOps

from epd.server.common.errors import InvalidArgument
from epd.server.media.policy import MediaPolicy


def _refuse(message: str, reason: str) -> InvalidArgument:
    return InvalidArgument(message, reason=reason)


def decode_image(data: bytes, policy: MediaPolicy) -> Image.Image:
    """Decode ``data`` under ``policy``'s limits; returns an RGB image."""
    if not data:
        raise _refuse("image is empty", "EMPTY_IMAGE")
    if len(data) > policy.max_bytes:
        raise _refuse(f"image is {len(data)} bytes, the limit is {policy.max_bytes}",
                      "IMAGE_TOO_LARGE")  # fmt: skip
    try:
        # NOTE: no warnings.catch_warnings here: it swaps process-wide state and decoding runs in
        # threads. Pillow's own bomb check (warning, then error at 2x) fires in open(); ours below
        # is tighter and runs before any pixel is decoded.
        image = Image.open(io.BytesIO(data))
        width, height = image.size
        if width * height > policy.max_pixels:
            raise _refuse(f"image is {width}x{height} pixels, the limit is "
                          f"{policy.max_pixels} pixels", "TOO_MANY_PIXELS")  # fmt: skip
        image.seek(0)
        image.load()
        return to_rgb(ImageOps.exif_transpose(image) or image)
    except InvalidArgument:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise _refuse(f"image refused as a decompression bomb: {e}", "TOO_MANY_PIXELS") from e
    except Exception as e:
        raise _refuse(f"cannot decode image: {type(e).__name__}: {e}", "BAD_IMAGE") from e


def declared_pixels(data: bytes) -> int | None:
    """Width x height as the image header declares it (nothing decoded); None if unreadable."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
    except Exception:
        return None
    return width * height


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
