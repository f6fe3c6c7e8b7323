"""The rules every image must pass, shared by the encode service and the route."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class MediaPolicy:
    """Limits and permissions for loading images."""

    max_bytes: int = 20 * MiB
    max_pixels: int = 32_000_000
    fetch_timeout_s: float = 10.0
    max_redirects: int = 5
    allow_local_files: bool = False
    allow_private_networks: bool = False

    def __post_init__(self) -> None:
        if self.max_bytes <= 0 or self.max_pixels <= 0 or self.fetch_timeout_s <= 0:
            raise ValueError("media limits must be positive")

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """Add the media flags (env fallbacks EPD_MEDIA_*)."""
        env = os.environ.get
        group = parser.add_argument_group("media")
        group.add_argument("--media-max-mb", type=float,
                           default=float(env("EPD_MEDIA_MAX_MB", 20)),
                           help="largest encoded image accepted, in MiB (env EPD_MEDIA_MAX_MB; "
                                "default 20)")
        group.add_argument("--media-max-pixels", type=int,
                           default=int(env("EPD_MEDIA_MAX_PIXELS", 32_000_000)),
                           help="largest decoded image, width x height; larger ones are refused "
                                "before decoding (env EPD_MEDIA_MAX_PIXELS; default 32000000)")
        group.add_argument("--media-fetch-timeout-s", type=float,
                           default=float(env("EPD_MEDIA_FETCH_TIMEOUT_S", 10)),
                           help="time limit for fetching one URL, redirects included "
                                "(env EPD_MEDIA_FETCH_TIMEOUT_S; default 10)")
        group.add_argument("--allow-local-files", action="store_true",
                           default=env("EPD_ALLOW_LOCAL_FILES") == "1",
                           help="accept file: URLs (env EPD_ALLOW_LOCAL_FILES=1; default off)")
        group.add_argument("--allow-private-networks", action="store_true",
                           default=env("EPD_ALLOW_PRIVATE_NETWORKS") == "1",
                           help="allow fetching from loopback, private and link-local addresses "
                                "(env EPD_ALLOW_PRIVATE_NETWORKS=1; default off: SSRF guard)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> MediaPolicy:
        """Build the policy from flags added by ``add_arguments``."""
        return cls(max_bytes=int(args.media_max_mb * MiB), max_pixels=args.media_max_pixels,
                   fetch_timeout_s=args.media_fetch_timeout_s,
                   allow_local_files=args.allow_local_files,
                   allow_private_networks=args.allow_private_networks)  # fmt: skip
