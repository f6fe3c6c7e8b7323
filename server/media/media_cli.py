"""Media flags shared by the command lines of services that load images, and their policy."""

from __future__ import annotations

import argparse

from epd.common.flags import add_dataclass_arguments, from_arguments
from epd.server.media.policy import MediaPolicy


def add_media_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the media flags (``MediaPolicy``'s fields declare them); ValueError naming an EPD_*
    variable whose value is malformed."""
    add_dataclass_arguments(parser.add_argument_group("media"), MediaPolicy)


def media_policy(args: argparse.Namespace) -> MediaPolicy:
    """The policy from flags added by ``add_media_arguments``; ValueError when out of range."""
    return from_arguments(MediaPolicy, args)
