"""Media flags shared by the command lines of services that load images, and their policy;
those ``epd up`` hands to the route."""

from __future__ import annotations

import argparse
import json

from epd.common.flags import add_dataclass_arguments, add_passed_on_arguments, from_arguments
from epd.server.media.policy import MediaPolicy


def add_media_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the media flags (``MediaPolicy``'s fields declare them); ValueError naming an EPD_*
    variable whose value is malformed."""
    add_dataclass_arguments(parser.add_argument_group("media"), MediaPolicy)


def media_policy(args: argparse.Namespace) -> MediaPolicy:
    """The policy from flags added by ``add_media_arguments``; ValueError when out of range."""
    return from_arguments(MediaPolicy, args)


#: ``MediaPolicy`` fields ``epd up`` hands to the route (vllm serve's flags of the same names)
PASSED_ON = ("mm_processor_kwargs", "media_io_kwargs", "trust_request_mm_kwargs")


def add_passed_on_media_arguments(parser: argparse.ArgumentParser) -> None:
    """``--mm-processor-kwargs``, ``--media-io-kwargs`` and ``--trust-request-mm-kwargs`` for
    ``epd up``, handed to the route when given (``route_media_flags``)."""
    add_passed_on_arguments(parser, MediaPolicy, dict.fromkeys(PASSED_ON))


def route_media_flags(args: argparse.Namespace) -> tuple[str, ...]:
    """The route's flags for the ``PASSED_ON`` values given to ``epd up``."""
    flags: list[str] = []
    for name in PASSED_ON:
        value, flag = getattr(args, name, None), f"--{name.replace('_', '-')}"
        if isinstance(value, bool):
            flags += [flag] if value else []
        elif value is not None:
            flags += [flag, json.dumps(value)]
    return tuple(flags)
