"""The rules every image must pass, shared by the encode service and the route."""

from __future__ import annotations

import argparse
import os
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

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """Add the media flags (env fallbacks EPD_MEDIA_*)."""
        env = os.environ.get
        group = parser.add_argument_group("media")
        group.add_argument(
            "--media-max-mb",
            type=float,
            default=float(env("EPD_MEDIA_MAX_MB", 20)),
            help="largest encoded image accepted, in MiB (env EPD_MEDIA_MAX_MB; default 20)",
        )
        group.add_argument(
            "--media-max-pixels",
            type=int,
            default=int(env("EPD_MEDIA_MAX_PIXELS", 32_000_000)),
            help="largest decoded image, width x height; larger ones are refused before "
            "decoding (env EPD_MEDIA_MAX_PIXELS; default 32000000)",
        )
        group.add_argument(
            "--media-fetch-timeout-s",
            type=float,
            default=float(env("EPD_MEDIA_FETCH_TIMEOUT_S", 10)),
            help="time limit for fetching one URL, redirects included "
            "(env EPD_MEDIA_FETCH_TIMEOUT_S; default 10)",
        )
        group.add_argument(
            "--media-max-url-chars",
            type=int,
            default=int(env("EPD_MEDIA_MAX_URL_CHARS", 8192)),
            help="longest http(s) or file: URL, and longest data: URL header; a data: URL's "
            "payload is bounded by --media-max-mb instead (env EPD_MEDIA_MAX_URL_CHARS; "
            "default 8192)",
        )
        group.add_argument(
            "--media-image-formats",
            type=_format_list,
            default=_format_list(env("EPD_MEDIA_IMAGE_FORMATS", ",".join(DEFAULT_IMAGE_FORMATS))),
            help="comma-separated Pillow formats accepted; others are refused before decoding "
            "(env EPD_MEDIA_IMAGE_FORMATS; default " + ",".join(DEFAULT_IMAGE_FORMATS) + ")",
        )
        group.add_argument(
            "--media-max-jpeg-scans",
            type=int,
            default=int(env("EPD_MEDIA_MAX_JPEG_SCANS", 100)),
            help="most scans a JPEG may have; each costs a pass over the image, so this bounds "
            "the decoding work per pixel (env EPD_MEDIA_MAX_JPEG_SCANS; default 100)",
        )
        group.add_argument(
            "--allow-local-files",
            action="store_true",
            default=env("EPD_ALLOW_LOCAL_FILES") == "1",
            help="accept file: URLs (env EPD_ALLOW_LOCAL_FILES=1; default off)",
        )
        group.add_argument(
            "--allow-private-networks",
            action="store_true",
            default=env("EPD_ALLOW_PRIVATE_NETWORKS") == "1",
            help="allow fetching from loopback, private and link-local addresses "
            "(env EPD_ALLOW_PRIVATE_NETWORKS=1; default off: SSRF guard)",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> MediaPolicy:
        """Build the policy from flags added by ``add_arguments``."""
        return cls(
            max_bytes=int(args.media_max_mb * MiB),
            max_pixels=args.media_max_pixels,
            fetch_timeout_s=args.media_fetch_timeout_s,
            allow_local_files=args.allow_local_files,
            allow_private_networks=args.allow_private_networks,
            max_url_chars=args.media_max_url_chars,
            image_formats=args.media_image_formats,
            max_jpeg_scans=args.media_max_jpeg_scans,
        )


def _format_list(text: str) -> tuple[str, ...]:
    return tuple(name.strip().upper() for name in text.split(",") if name.strip())
