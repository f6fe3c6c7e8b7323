"""``epd up``'s pass-through of the route's tool and reasoning flags (``tools.ToolOptions``)."""

from __future__ import annotations

import argparse

from epd.common.flags import add_passed_on_arguments
from epd.server.route.tools import ToolOptions, check_tool_options

TOOL_FIELDS = ("enable_auto_tool_choice", "tool_call_parser", "reasoning_parser")


def add_passed_on_tool_arguments(parser: argparse.ArgumentParser) -> None:
    """``--enable-auto-tool-choice``, ``--tool-call-parser`` and ``--reasoning-parser``, handed
    to the route when given."""
    add_passed_on_arguments(parser, ToolOptions, dict.fromkeys(TOOL_FIELDS))


def route_tool_flags(args: argparse.Namespace) -> tuple[str, ...]:
    """The tool flags given, as the route's flags; ValueError as the route would raise it."""
    options = ToolOptions(
        enable_auto_tool_choice=bool(args.enable_auto_tool_choice),
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
    )
    check_tool_options(options)
    flags = ["--enable-auto-tool-choice"] if options.enable_auto_tool_choice else []
    for name in TOOL_FIELDS[1:]:
        if (value := getattr(options, name)) is not None:
            flags += [f"--{name.replace('_', '-')}", value]
    return tuple(flags)
