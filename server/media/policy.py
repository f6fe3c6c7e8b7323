"""The rules every image must pass, shared by the encode service and the route."""

from __future__ import annotations

from dataclasses import dataclass, field

from PIL import Image

from epd.common.flags import flag

MiB = 1 << 20

# NOTE: formats Pillow decodes itself with widely fuzzed libraries. Never EPS (Pillow runs
# Ghostscript on it) nor the long tail of rarely used plugins.
DEFAULT_IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")
EXTERNAL_PROGRAM_FORMATS = frozenset({"EPS"})


def format_list(text: str) -> tuple[str, ...]:
    """Pillow format names from a comma-separated list, upper-cased."""
    return tuple(name.strip().upper() for name in text.split(",") if name.strip())


@dataclass(frozen=True, slots=True)
class MediaPolicy:
    """Limits and permissions for loading images.

    ``max_url_chars`` bounds http(s) and file: URLs and the header of a data: URL, whose payload
    is bounded by ``max_bytes`` instead (base64: about 4/3 of it). ``image_formats`` are the
    Pillow format names accepted (an MPO file from a camera is read as JPEG). ``max_jpeg_scans``
    bounds the scans of a JPEG: decoding costs a pass over the image per scan, so it bounds the
    decoding work per pixel (real progressive JPEGs have about 10).
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
