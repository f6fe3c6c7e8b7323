"""The rules every image must pass, shared by the encode service and the route."""

from __future__ import annotations

from dataclasses import dataclass

from PIL import Image

MiB = 1 << 20

# NOTE: formats Pillow decodes itself with widely fuzzed libraries. Never EPS (Pillow runs
# Ghostscript on it) nor the long tail of rarely used plugins.
DEFAULT_IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")
EXTERNAL_PROGRAM_FORMATS = frozenset({"EPS"})


@dataclass(frozen=True, slots=True)
class MediaPolicy:
    """Limits and permissions for loading images.

    ``max_url_chars`` bounds http(s) and file: URLs and the header of a data: URL, whose payload
    is bounded by ``max_bytes`` instead (base64: about 4/3 of it). ``image_formats`` are the
    Pillow format names accepted (an MPO file from a camera is read as JPEG). ``max_jpeg_scans``
    bounds the scans of a JPEG: decoding costs a pass over the image per scan, so it bounds the
    decoding work per pixel (real progressive JPEGs have about 10).
    """

    max_bytes: int = 20 * MiB
    max_pixels: int = 32_000_000
    fetch_timeout_s: float = 10.0
    max_redirects: int = 5
    allow_local_files: bool = False
    allow_private_networks: bool = False
    max_url_chars: int = 8 << 10
    image_formats: tuple[str, ...] = DEFAULT_IMAGE_FORMATS
    max_jpeg_scans: int = 100

    def __post_init__(self) -> None:
        limits = (
            self.max_bytes,
            self.max_pixels,
            self.fetch_timeout_s,
            self.max_url_chars,
            self.max_jpeg_scans,
        )
        if min(limits) <= 0:
            raise ValueError("media limits must be positive")
        Image.init()
        unknown = [name for name in self.image_formats if name not in Image.OPEN]
        if unknown or not self.image_formats:
            raise ValueError(f"image formats {unknown} are not formats Pillow reads")
        if EXTERNAL_PROGRAM_FORMATS.intersection(self.image_formats):
            raise ValueError(
                f"{sorted(EXTERNAL_PROGRAM_FORMATS)} images are decoded by an "
                "external program and cannot be accepted"
            )
