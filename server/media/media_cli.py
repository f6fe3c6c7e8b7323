"""Media flags shared by the command lines of services that load images, and their policy."""

from __future__ import annotations

import argparse
import os

from epd.server.media.policy import DEFAULT_IMAGE_FORMATS, MediaPolicy, MiB


def add_media_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the media flags; each falls back to an EPD_* environment variable."""
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


def media_policy(args: argparse.Namespace) -> MediaPolicy:
    """The policy from flags added by ``add_media_arguments``; ValueError when out of range."""
    return MediaPolicy(
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
