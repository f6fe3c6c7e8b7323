"""Media flags shared by the command lines of services that load images, and their policy."""

from __future__ import annotations

import argparse
import os

from epd.server.media.policy import MediaPolicy, MiB


def add_media_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the media flags; each falls back to an EPD_* environment variable. ``MediaPolicy``
    owns their defaults."""
    env = os.environ.get
    policy = MediaPolicy()
    formats = ",".join(policy.image_formats)
    group = parser.add_argument_group("media")
    group.add_argument(
        "--media-max-mb",
        type=float,
        default=float(env("EPD_MEDIA_MAX_MB", policy.max_bytes / MiB)),
        help="largest encoded image accepted, in MiB (env EPD_MEDIA_MAX_MB; default "
        f"{policy.max_bytes / MiB:g})",
    )
    group.add_argument(
        "--media-max-pixels",
        type=int,
        default=int(env("EPD_MEDIA_MAX_PIXELS", policy.max_pixels)),
        help="largest decoded image, width x height; larger ones are refused before "
        f"decoding (env EPD_MEDIA_MAX_PIXELS; default {policy.max_pixels})",
    )
    group.add_argument(
        "--media-fetch-timeout-s",
        type=float,
        default=float(env("EPD_MEDIA_FETCH_TIMEOUT_S", policy.fetch_timeout_s)),
        help="time limit for fetching one URL, redirects included "
        f"(env EPD_MEDIA_FETCH_TIMEOUT_S; default {policy.fetch_timeout_s:g})",
    )
    group.add_argument(
        "--media-max-url-chars",
        type=int,
        default=int(env("EPD_MEDIA_MAX_URL_CHARS", policy.max_url_chars)),
        help="longest http(s) or file: URL, and longest data: URL header; a data: URL's "
        "payload is bounded by --media-max-mb instead (env EPD_MEDIA_MAX_URL_CHARS; "
        f"default {policy.max_url_chars})",
    )
    group.add_argument(
        "--media-image-formats",
        type=_format_list,
        default=_format_list(env("EPD_MEDIA_IMAGE_FORMATS", formats)),
        help="comma-separated Pillow formats accepted; others are refused before decoding "
        f"(env EPD_MEDIA_IMAGE_FORMATS; default {formats})",
    )
    group.add_argument(
        "--media-max-jpeg-scans",
        type=int,
        default=int(env("EPD_MEDIA_MAX_JPEG_SCANS", policy.max_jpeg_scans)),
        help="most scans a JPEG may have; each costs a pass over the image, so this bounds "
        f"the decoding work per pixel (env EPD_MEDIA_MAX_JPEG_SCANS; default "
        f"{policy.max_jpeg_scans})",
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
